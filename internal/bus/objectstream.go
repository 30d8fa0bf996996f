package bus

import (
	"context"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go/jetstream"
)

// StoreStreamed stores what write writes, gzipped as StoreObject
// stores it, without holding it whole: write runs beside the put, into
// the compressor, whose output the object store reads chunk by chunk. A
// 400,000-worker plan's snapshot is about 60 MB of JSON; held whole,
// then gzipped whole, it set the planner's peak memory. size is the
// bytes stored.
func StoreStreamed(ctx context.Context, js jetstream.JetStream, bucket, name string, write func(io.Writer) error) (size int, err error) {
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return 0, fmt.Errorf("object store %s: %w", bucket, err)
	}
	pr, pw := io.Pipe()
	counted := &countingWriter{w: pw}
	done := make(chan error, 1)
	go func() {
		zw, _ := gzip.NewWriterLevel(counted, gzip.BestSpeed)
		err := write(zw)
		if cerr := zw.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err) // nil: the reader sees the end
		done <- err
	}()
	chunk := uint32(min(objectChunk, BodyLimit(js.Conn())))
	meta := jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk}}
	// The object store sends each Read as a chunk: a pipe's Read is one
	// of the compressor's writes, often a few bytes, so a large snapshot
	// was thousands of tiny chunks, past the async publish window under
	// load. Each Read fills a chunk.
	_, perr := obs.Put(ctx, meta, fullReader{pr})
	// A put that stopped reading must not leave the writer blocked.
	pr.CloseWithError(io.ErrClosedPipe)
	werr := <-done
	if perr != nil {
		return 0, fmt.Errorf("store object %s/%s: %w", bucket, name, perr)
	}
	if werr != nil {
		return 0, fmt.Errorf("store object %s/%s: %w", bucket, name, werr)
	}
	return counted.n, nil
}

// fullReader reads whole buffers of r: each Read fills p but at r's end.
type fullReader struct{ r io.Reader }

func (f fullReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if err == io.ErrUnexpectedEOF {
		err = nil // the last, short part; the next Read says EOF
	}
	return n, err
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}
