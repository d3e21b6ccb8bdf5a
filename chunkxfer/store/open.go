package store

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Open returns the store a URL names:
//
//	file:///abs/path                      a local directory (Dir)
//	s3://bucket/prefix?endpoint=URL&region=R&path-style=true
//
// S3 credentials come from creds when set, else from the usual AWS chain.
// The URL never carries a secret.
func Open(ctx context.Context, rawURL string, creds S3Options) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("store URL: %w", err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("store URL %q: file URLs take an absolute path (file:///path)", rawURL)
		}
		return NewDir(u.Path)
	case "s3":
		q := u.Query()
		for k := range q {
			switch k {
			case "endpoint", "region", "path-style":
			default:
				return nil, fmt.Errorf("store URL: unknown parameter %q (endpoint, region, path-style)", k)
			}
		}
		o := S3Options{
			Bucket:    u.Host,
			Prefix:    strings.TrimPrefix(u.Path, "/"),
			Endpoint:  q.Get("endpoint"),
			Region:    q.Get("region"),
			AccessKey: creds.AccessKey,
			SecretKey: creds.SecretKey,
		}
		if ps := q.Get("path-style"); ps != "" {
			if o.PathStyle, err = strconv.ParseBool(ps); err != nil {
				return nil, fmt.Errorf("store URL: path-style=%q: %w", ps, err)
			}
		} else {
			// S3-compatible servers on an endpoint want path style.
			o.PathStyle = o.Endpoint != ""
		}
		if u.User != nil {
			return nil, fmt.Errorf("store URL: credentials do not belong in the URL; use flags or the AWS environment")
		}
		return NewS3(ctx, o)
	}
	return nil, fmt.Errorf("store URL %q: scheme must be file or s3", rawURL)
}
