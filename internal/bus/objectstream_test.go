package bus

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// TestStoreStreamed: what a write streams is stored as StoreObject
// stores it (gzipped, over many chunks), its size the bytes stored; a
// write that fails, or a put refused, is an error, and neither side is
// left waiting.
func TestStoreStreamed(t *testing.T) {
	srv := natstest.Start(t)
	js, _ := jetstream.New(srv.Conn(t))
	ctx := context.Background()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "streamed"})
	if err != nil {
		t.Fatal(err)
	}
	// Enough that the compressed stream spans several chunks.
	var want bytes.Buffer
	for i := range 200000 {
		want.WriteString(strings.Repeat("x", i%7))
		want.WriteString(string(rune('a' + i%26)))
	}
	size, err := StoreStreamed(ctx, js, "streamed", "doc", func(w io.Writer) error {
		for b := want.Bytes(); len(b) > 0; {
			n := min(len(b), 4096)
			if _, err := w.Write(b[:n]); err != nil {
				return err
			}
			b = b[n:]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	z, err := obs.GetBytes(ctx, "doc")
	if err != nil {
		t.Fatal(err)
	}
	if size != len(z) {
		t.Errorf("size %d, stored %d bytes", size, len(z))
	}
	// Whole chunks but the last, however small the compressor's writes:
	// a chunk per write was thousands of publishes for a large plan.
	info, err := obs.GetInfo(ctx, "doc")
	if err != nil {
		t.Fatal(err)
	}
	chunk := int(min(objectChunk, BodyLimit(srv.Conn(t))))
	if want := (len(z) + chunk - 1) / chunk; int(info.Chunks) != want {
		t.Errorf("%d bytes stored in %d chunks, want %d of at most %d bytes", len(z), info.Chunks, want, chunk)
	}
	got, err := wire.Gunzip(z, 1<<30)
	if err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("stored %d bytes back, want %d: %v", len(got), want.Len(), err)
	}
	boom := errors.New("boom")
	if _, err := StoreStreamed(ctx, js, "streamed", "bad", func(w io.Writer) error {
		_, _ = w.Write([]byte("part"))
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("a failed write: %v, want boom", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := StoreStreamed(cctx, js, "streamed", "cancelled", func(w io.Writer) error {
		_, err := w.Write(want.Bytes())
		return err
	}); err == nil {
		t.Error("a put with its context done succeeded")
	}
}
