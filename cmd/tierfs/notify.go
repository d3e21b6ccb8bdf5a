package main

import (
	"net"
	"os"
)

// sdNotify tells a supervising systemd (Type=notify) the service's state,
// e.g. "READY=1": one datagram to $NOTIFY_SOCKET (a leading @ is the
// abstract namespace, which Go maps). Without the variable it does nothing.
func sdNotify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}
