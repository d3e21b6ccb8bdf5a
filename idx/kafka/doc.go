// Package kafka reads Kafka's own log directory formats: segment and
// partition directory names, record batch (v2) headers in a segment, and
// checkpoint files. It is pure format code: no I/O policy, no FUSE, no S3.
// Every decoder returns a *FormatError naming the file and byte offset of
// bad input; none panics or reads past its input.
package kafka

import "fmt"

// FormatError is malformed input at a position in a file.
type FormatError struct {
	File   string
	Offset int64
	Msg    string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s: offset %d: %s", e.File, e.Offset, e.Msg)
}

func formatErr(file string, off int64, format string, args ...any) *FormatError {
	return &FormatError{File: file, Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// ReadError is a failure to read input, not a format problem: the reader
// failed or the input is shorter than its stated size.
type ReadError struct {
	File   string
	Offset int64
	Err    error
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("%s: read at offset %d: %v", e.File, e.Offset, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }
