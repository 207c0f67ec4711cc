package savepoint

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/sluicehq/sluice/kstate"
)

// maxValueSize bounds one entry's value when reading, so a damaged length
// cannot ask for an absurd allocation before the checksum would catch it.
// State entries are bounded far lower by the changelog's max.message.bytes.
const maxValueSize = 1 << 30

// Savepoint is a complete savepoint opened for reading. Close releases
// its storage client.
type Savepoint struct {
	// Location is where the savepoint is, as Open was given it but
	// absolute: a path or an s3:// or gs:// URL.
	Location string
	Manifest Manifest
	st       store
}

// Open reads the manifest of the savepoint at location: a path, a
// file://path, or an s3://bucket/prefix?query or gs://bucket/prefix?query
// URL (ErrLocation for any other). A location without a manifest is incomplete (ErrIncomplete); a
// manifest of another format version is ErrFormat. Open does not read the
// data files: call Verify for that.
func Open(ctx context.Context, location string) (*Savepoint, error) {
	l, err := parseLocation(location)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, l)
	if err != nil {
		return nil, err
	}
	m, err := readManifest(ctx, st, l.String())
	if err != nil {
		st.Close()
		return nil, err
	}
	return &Savepoint{Location: l.String(), Manifest: m, st: st}, nil
}

// Close releases the savepoint's storage client.
func (s *Savepoint) Close() error { return s.st.Close() }

// Verify checks every data file's size and SHA-256 against the manifest,
// and returns an error wrapping ErrChecksum for the first that differs.
// It reads the files, not the entries: a caller that must not act on a
// damaged savepoint verifies it before scanning.
func (s *Savepoint) Verify(ctx context.Context) error {
	for _, t := range s.Manifest.Tasks {
		f, err := s.st.Open(ctx, t.File)
		if err != nil {
			return fmt.Errorf("savepoint: task %d: %w", t.Partition, err)
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("savepoint: task %d: %w", t.Partition, err)
		}
		if err := t.check(n, h.Sum(nil)); err != nil {
			return err
		}
	}
	return nil
}

func (t Task) check(size int64, sum []byte) error {
	if size != t.Bytes {
		return fmt.Errorf("%w: %s is %d bytes, the manifest says %d", ErrChecksum, t.File, size, t.Bytes)
	}
	if got := hex.EncodeToString(sum); got != t.SHA256 {
		return fmt.Errorf("%w: %s has SHA-256 %s, the manifest says %s", ErrChecksum, t.File, got, t.SHA256)
	}
	return nil
}

// Scan calls fn for every entry of task t's data file, in ascending key
// order; k and v are valid only during the call. It checks the file's
// format and, once the file is read, its size, SHA-256 and key count: a
// damaged file may have produced entries before the error, so verify
// first (Verify) where that matters. An error from fn ends the scan and is
// returned.
func (s *Savepoint) Scan(ctx context.Context, t Task, fn func(k, v []byte) error) error {
	f, err := s.st.Open(ctx, t.File)
	if err != nil {
		return fmt.Errorf("savepoint: task %d: %w", t.Partition, err)
	}
	defer f.Close()
	h := sha256.New()
	raw := &countingReader{r: io.TeeReader(f, h)}
	zr, err := zstd.NewReader(raw, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("savepoint: task %d: %w", t.Partition, err)
	}
	defer zr.Close()
	keys, err := scanEntries(bufio.NewReader(zr), fn)
	var st stopped
	if errors.As(err, &st) {
		return st.err
	}
	// The checksum covers the whole file: read what the decoder left. A
	// damaged file usually fails to decode too; the checksum says why.
	if _, cerr := io.Copy(io.Discard, raw); cerr != nil {
		return fmt.Errorf("savepoint: task %d: %w", t.Partition, cerr)
	}
	if cerr := t.check(raw.n, h.Sum(nil)); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrFormat, t.File, err)
	}
	if keys != t.Keys {
		return fmt.Errorf("%w: %s holds %d keys, the manifest says %d", ErrFormat, t.File, keys, t.Keys)
	}
	return nil
}

// stopped carries an error returned by the caller's fn, to tell it from a
// format error.
type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }

func scanEntries(r *bufio.Reader, fn func(k, v []byte) error) (int64, error) {
	head := make([]byte, len(dataMagic)+1)
	if _, err := io.ReadFull(r, head); err != nil {
		return 0, fmt.Errorf("header: %v", err)
	}
	if string(head[:len(dataMagic)]) != dataMagic {
		return 0, fmt.Errorf("magic %q, want %q", head[:len(dataMagic)], dataMagic)
	}
	if head[len(dataMagic)] != dataVersion {
		return 0, fmt.Errorf("data version %d, this release reads %d", head[len(dataMagic)], dataVersion)
	}
	var keys int64
	var k, prev, v []byte
	for {
		kl, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return keys, nil
		}
		if err != nil {
			return keys, fmt.Errorf("entry %d: key length: %v", keys, err)
		}
		if kl == 0 || kl > kstate.MaxKeySize {
			return keys, fmt.Errorf("entry %d: key length %d", keys, kl)
		}
		if k, err = readN(r, k, kl); err != nil {
			return keys, fmt.Errorf("entry %d: key: %v", keys, err)
		}
		if keys > 0 && bytes.Compare(prev, k) >= 0 {
			return keys, fmt.Errorf("entry %d: keys not ascending", keys)
		}
		vl, err := binary.ReadUvarint(r)
		if err != nil {
			return keys, fmt.Errorf("entry %d: value length: %v", keys, noEOF(err))
		}
		if vl > maxValueSize {
			return keys, fmt.Errorf("entry %d: value length %d", keys, vl)
		}
		if v, err = readN(r, v, vl); err != nil {
			return keys, fmt.Errorf("entry %d: value: %v", keys, err)
		}
		if err := fn(k, v); err != nil {
			return keys, stopped{err}
		}
		prev = append(prev[:0], k...)
		keys++
	}
}

func readN(r io.Reader, buf []byte, n uint64) ([]byte, error) {
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, noEOF(err)
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
