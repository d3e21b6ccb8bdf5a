package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// S3Options configure an S3 store.
type S3Options struct {
	Bucket   string
	Prefix   string // prepended to every key ("" or ending in "/")
	Endpoint string // e.g. http://127.0.0.1:7070; "" for AWS
	Region   string // default us-east-1
	// PathStyle addresses the bucket in the path (needed by most
	// S3-compatible servers), not in the host name.
	PathStyle bool
	// AccessKey and SecretKey, when set, are used instead of the usual
	// AWS chain (environment, shared files, instance role).
	AccessKey string
	SecretKey string
	// MaxAttempts per request, with exponential backoff (default 6).
	MaxAttempts int
	// Timeout bounds each attempt of a request, body included (default
	// 2 min: an 8 MiB part at 1 MB/s still fits).
	Timeout time.Duration
}

// String prints the options without the secret.
func (o S3Options) String() string {
	key := ""
	if o.AccessKey != "" {
		key = " access-key=" + o.AccessKey[:min(4, len(o.AccessKey))] + "…"
	}
	return fmt.Sprintf("s3://%s/%s endpoint=%q region=%s path-style=%v%s", o.Bucket, o.Prefix, o.Endpoint, o.Region, o.PathStyle, key)
}

// maxIdleConns is how many idle connections the client keeps.
const maxIdleConns = 512

// call runs an SDK call on a goroutine of s's pool (see callPool).
func call[T any](s *S3, f func() (T, error)) (T, error) {
	var v T
	var err error
	s.calls.run(func() { v, err = f() })
	return v, err
}

// S3 is a Store on an S3 bucket, through aws-sdk-go-v2.
type S3 struct {
	c      *s3.Client
	bucket string
	prefix string
	calls  *callPool
}

// NewS3 builds the client; it makes no request.
func NewS3(ctx context.Context, o S3Options) (*S3, error) {
	if o.Bucket == "" {
		return nil, errors.New("s3 store: no bucket")
	}
	if o.Prefix != "" && !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.Region == "" {
		o.Region = "us-east-1"
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 6
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	httpClient := awshttp.NewBuildableClient().WithTimeout(o.Timeout).WithTransportOptions(func(t *http.Transport) {
		// As many idle connections kept as requests go at once: a
		// shipment of small segments has a few hundred in flight (each
		// segment's objects at once, several segments of several
		// partitions at once), and a connection not kept is dialled
		// again for the next request (a profile of shipping put a sixth
		// of tierfs's CPU in dialling and closing them with 64).
		t.MaxIdleConns = maxIdleConns
		t.MaxIdleConnsPerHost = maxIdleConns
		t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		t.ResponseHeaderTimeout = o.Timeout
	})
	opts := []func(*config.LoadOptions) error{
		config.WithRegion(o.Region),
		config.WithHTTPClient(httpClient),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(s *retry.StandardOptions) {
				s.MaxAttempts = o.MaxAttempts
				// Short: a FUSE read waits for these retries.
				s.MaxBackoff = 2 * time.Second
				// No client-side retry quota: a burst of failures
				// must not turn later retries off.
				s.RateLimiter = ratelimit.None
			})
		}),
		// tierfs checks its own CRC32C of every chunk; the SDK's
		// default request checksums are not supported by every
		// S3-compatible server.
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if o.AccessKey != "" || o.SecretKey != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(o.AccessKey, o.SecretKey, "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 store: %w", err)
	}
	c := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
	})
	return &S3{c: c, bucket: o.Bucket, prefix: o.Prefix, calls: newCallPool(poolWorkers, poolIdle)}, nil
}

// CreateBucket creates the bucket (for tests and first setup); an
// existing bucket owned by the caller is not an error.
func (s *S3) CreateBucket(ctx context.Context) error {
	_, err := call(s, func() (*s3.CreateBucketOutput, error) {
		return s.c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &s.bucket})
	})
	var owned *types.BucketAlreadyOwnedByYou
	if errors.As(err, &owned) {
		return nil
	}
	return mapS3("create bucket", s.bucket, err)
}

func (s *S3) key(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// mapS3 turns SDK errors into the store's sentinels by HTTP status and
// error code, never by message text.
func mapS3(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var re *awshttp.ResponseError
	status := 0
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	var api smithy.APIError
	code := ""
	if errors.As(err, &api) {
		code = api.ErrorCode()
	}
	switch {
	case status == http.StatusNotFound || code == "NoSuchKey" || code == "NotFound" || code == "NoSuchUpload":
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	case status == http.StatusPreconditionFailed || code == "PreconditionFailed":
		return fmt.Errorf("%s %s: %w", op, key, ErrPrecondition)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func (s *S3) Get(ctx context.Context, key string, off, n int64, opt GetOptions) (io.ReadCloser, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, fmt.Errorf("get %s: negative offset %d", key, off)
	}
	in := &s3.GetObjectInput{Bucket: &s.bucket, Key: &k}
	if opt.IfMatch != "" {
		in.IfMatch = aws.String(opt.IfMatch)
	}
	switch {
	case n == 0:
		if _, err := s.Head(ctx, key); err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader("")), nil
	case n > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	case off > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", off))
	}
	out, err := call(s, func() (*s3.GetObjectOutput, error) { return s.c.GetObject(ctx, in) })
	if err != nil {
		var re *awshttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestedRangeNotSatisfiable {
			// A range starting at the end: empty, as from the other stores.
			if info, herr := s.Head(ctx, key); herr == nil && info.Size == off {
				return io.NopCloser(strings.NewReader("")), nil
			}
			return nil, fmt.Errorf("get %s: offset %d outside the object", key, off)
		}
		return nil, mapS3("get", key, err)
	}
	return out.Body, nil
}

func (s *S3) Head(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	out, err := call(s, func() (*s3.HeadObjectOutput, error) {
		return s.c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &k})
	})
	if err != nil {
		return ObjectInfo{}, mapS3("head", key, err)
	}
	return ObjectInfo{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: aws.ToString(out.ETag), ModTime: aws.ToTime(out.LastModified)}, nil
}

func (s *S3) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) (ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	out, err := call(s, func() (*s3.PutObjectOutput, error) {
		return s.c.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: &k, Body: body, ContentLength: aws.Int64(size)})
	})
	if err != nil {
		return ObjectInfo{}, mapS3("put", key, err)
	}
	return ObjectInfo{Key: key, Size: size, ETag: aws.ToString(out.ETag)}, nil
}

func (s *S3) PutIf(ctx context.Context, key string, body io.ReadSeeker, size int64, cond PutCond) (ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	if err := cond.check(key); err != nil {
		return ObjectInfo{}, err
	}
	in := &s3.PutObjectInput{Bucket: &s.bucket, Key: &k, Body: body, ContentLength: aws.Int64(size)}
	if cond.IfNoneMatch {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(cond.IfMatch)
	}
	out, err := call(s, func() (*s3.PutObjectOutput, error) { return s.c.PutObject(ctx, in) })
	if err != nil {
		// 409 ConditionalRequestConflict: another conditional write won
		// the race; to the caller the same as a failed condition.
		var re *awshttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusConflict {
			return ObjectInfo{}, fmt.Errorf("put %s: %v: %w", key, err, ErrPrecondition)
		}
		err = mapS3("put", key, err)
		if cond.IfMatch != "" && errors.Is(err, ErrNotFound) {
			// Some servers answer a failed If-Match on a missing
			// object with 404.
			err = fmt.Errorf("put %s: %w", key, ErrPrecondition)
		}
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: key, Size: size, ETag: aws.ToString(out.ETag)}, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	_, err = call(s, func() (*s3.DeleteObjectOutput, error) {
		return s.c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &k})
	})
	if err = mapS3("delete", key, err); errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

func (s *S3) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	var out []ObjectInfo
	p := s3.NewListObjectsV2Paginator(s.c, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.prefix + prefix)})
	for p.HasMorePages() {
		page, err := call(s, func() (*s3.ListObjectsV2Output, error) { return p.NextPage(ctx) })
		if err != nil {
			return nil, mapS3("list", prefix, err)
		}
		for _, o := range page.Contents {
			out = append(out, ObjectInfo{Key: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag), ModTime: aws.ToTime(o.LastModified)})
		}
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *S3) CreateMultipart(ctx context.Context, key string) (string, error) {
	k, err := s.key(key)
	if err != nil {
		return "", err
	}
	out, err := call(s, func() (*s3.CreateMultipartUploadOutput, error) {
		return s.c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &s.bucket, Key: &k})
	})
	if err != nil {
		return "", mapS3("create multipart", key, err)
	}
	return aws.ToString(out.UploadId), nil
}

func (s *S3) UploadPart(ctx context.Context, key, id string, num int32, body io.ReadSeeker, size int64) (Part, error) {
	k, err := s.key(key)
	if err != nil {
		return Part{}, err
	}
	if num < 1 || num > MaxParts {
		return Part{}, fmt.Errorf("part number %d outside 1..%d", num, MaxParts)
	}
	out, err := call(s, func() (*s3.UploadPartOutput, error) {
		return s.c.UploadPart(ctx, &s3.UploadPartInput{Bucket: &s.bucket, Key: &k, UploadId: &id, PartNumber: aws.Int32(num), Body: body, ContentLength: aws.Int64(size)})
	})
	if err != nil {
		return Part{}, mapS3(fmt.Sprintf("upload part %d of", num), key, err)
	}
	return Part{Number: num, ETag: aws.ToString(out.ETag), Size: size}, nil
}

func (s *S3) ListParts(ctx context.Context, key, id string) ([]Part, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, err
	}
	var out []Part
	p := s3.NewListPartsPaginator(s.c, &s3.ListPartsInput{Bucket: &s.bucket, Key: &k, UploadId: &id})
	for p.HasMorePages() {
		page, err := call(s, func() (*s3.ListPartsOutput, error) { return p.NextPage(ctx) })
		if err != nil {
			return nil, mapS3("list parts", key, err)
		}
		for _, pt := range page.Parts {
			out = append(out, Part{Number: aws.ToInt32(pt.PartNumber), ETag: aws.ToString(pt.ETag), Size: aws.ToInt64(pt.Size)})
		}
	}
	slices.SortFunc(out, func(a, b Part) int { return int(a.Number - b.Number) })
	return out, nil
}

func (s *S3) CompleteMultipart(ctx context.Context, key, id string, parts []Part) (ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	var cp []types.CompletedPart
	var size int64
	for _, p := range parts {
		cp = append(cp, types.CompletedPart{PartNumber: aws.Int32(p.Number), ETag: aws.String(p.ETag)})
		size += p.Size
	}
	out, err := call(s, func() (*s3.CompleteMultipartUploadOutput, error) {
		return s.c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket: &s.bucket, Key: &k, UploadId: &id, MultipartUpload: &types.CompletedMultipartUpload{Parts: cp},
		})
	})
	if err != nil {
		return ObjectInfo{}, mapS3("complete multipart", key, err)
	}
	return ObjectInfo{Key: key, Size: size, ETag: aws.ToString(out.ETag)}, nil
}

func (s *S3) AbortMultipart(ctx context.Context, key, id string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	_, err = call(s, func() (*s3.AbortMultipartUploadOutput, error) {
		return s.c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: &k, UploadId: &id})
	})
	return mapS3("abort multipart", key, err)
}

func (s *S3) ListMultipart(ctx context.Context, prefix string) ([]Upload, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	var out []Upload
	in := &s3.ListMultipartUploadsInput{Bucket: &s.bucket, Prefix: aws.String(s.prefix + prefix)}
	for {
		page, err := call(s, func() (*s3.ListMultipartUploadsOutput, error) { return s.c.ListMultipartUploads(ctx, in) })
		if err != nil {
			return nil, mapS3("list multipart", prefix, err)
		}
		for _, u := range page.Uploads {
			out = append(out, Upload{Key: strings.TrimPrefix(aws.ToString(u.Key), s.prefix), UploadID: aws.ToString(u.UploadId), Initiated: aws.ToTime(u.Initiated)})
		}
		if !aws.ToBool(page.IsTruncated) {
			break
		}
		in.KeyMarker, in.UploadIdMarker = page.NextKeyMarker, page.NextUploadIdMarker
	}
	slices.SortFunc(out, func(a, b Upload) int { return strings.Compare(a.Key+a.UploadID, b.Key+b.UploadID) })
	return out, nil
}

// Client is the underlying SDK client (for benchmarks that measure the
// raw limits), with the bucket and key prefix.
func (s *S3) Client() (c *s3.Client, bucket, prefix string) { return s.c, s.bucket, s.prefix }
