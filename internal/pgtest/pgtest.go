package pgtest

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one PostgreSQL server of a test.
type Server struct {
	bin  string // directory of initdb and postgres
	dir  string // owns data/ and the log
	port int
	cred *syscall.Credential // the postgres OS user when the test runs as root

	proc   *exec.Cmd     // the postmaster, nil when stopped
	exited chan struct{} // closed when proc has exited
}

// MaxPreparedTransactions is what the server allows: enough for every task
// of a test's instances to hold a prepared epoch, and then some.
const MaxPreparedTransactions = 64

// Start runs initdb and starts a server; it is stopped and removed in
// t.Cleanup. A missing PostgreSQL installation fails the test.
func Start(t testing.TB, conf ...string) *Server {
	t.Helper()
	bin, err := findBin()
	if err != nil {
		t.Fatalf("pgtest: %v (.ci/run installs it: apt-get install -y postgresql)", err)
	}
	// Not t.TempDir: its parents are root's, 0700, so the postgres user
	// could not reach its data directory.
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root, and initdb refuses root: need a postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, err := s.template()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if out, err := exec.Command("cp", "-a", tmpl, s.data()).CombinedOutput(); err != nil {
		t.Fatalf("pgtest: copy the initdb template: %v\n%s", err, out)
	}
	s.port, err = freePort()
	if err != nil {
		t.Fatal(err)
	}
	settings := append([]string{
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", s.port),
		"unix_socket_directories = ''",
		fmt.Sprintf("max_prepared_transactions = %d", MaxPreparedTransactions),
		"max_connections = 100",
		"fsync = off", // a test server: durability across an OS crash is not what is tested
		"shared_buffers = 32MB",
	}, conf...)
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range settings {
		fmt.Fprintln(f, line)
	}
	f.Close()
	s.Restart(t)
	t.Cleanup(func() { s.stop() })
	return s
}

// URL is the server's connection string: user postgres, database
// postgres, no password, no TLS.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Database creates a database of its own for a test sharing the server
// and returns its connection string.
func (s *Server) Database(t testing.TB, name string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, url.PathEscape(name))
}

// Stop stops the server (fast shutdown: sessions are cut, prepared
// transactions stay).
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop(); err != nil {
		t.Fatalf("pgtest: stop: %v\n%s", err, s.logTail())
	}
}

func (s *Server) stop() error {
	if s.proc == nil {
		return nil
	}
	s.proc.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		s.proc.Process.Kill()
		<-s.exited
		s.proc = nil
		return fmt.Errorf("the server did not stop within 60s")
	}
	s.proc = nil
	return nil
}

// Restart starts the server again on the same port and waits until it
// accepts connections. The postmaster is this process's child with a
// parent-death signal, so a test binary killed by its timeout does not
// leave servers behind.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := s.cmd("postgres", "-D", s.data())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("pgtest: start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(exited)
	}()
	s.proc, s.exited = cmd, exited
	ctx := context.Background()
	deadline := time.Now().Add(120 * time.Second)
	for {
		c, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			c.Close(ctx)
			return
		}
		select {
		case <-exited:
			s.proc = nil
			t.Fatalf("pgtest: the server exited at start: %v\n%s", err, s.logTail())
		case <-time.After(20 * time.Millisecond): // polling for the server to accept connections, with a deadline
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: the server does not accept connections after 120s: %v\n%s", err, s.logTail())
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func (s *Server) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(s.bin, name), args...)
	c.Dir = s.dir
	c.SysProcAttr = &syscall.SysProcAttr{}
	if s.cred != nil {
		c.SysProcAttr.Credential = s.cred
	}
	return c
}

// template returns a data directory fresh from initdb, made once per
// machine and PostgreSQL installation and then copied for each server:
// initdb takes seconds, a copy a fraction of one. It lives in the system's
// temporary directory like a build cache, made under a temporary name and
// renamed into place, so concurrent test processes never see half of one.
func (s *Server) template() (string, error) {
	name := fmt.Sprintf("sluice-pgtest-template-%x", crc32.ChecksumIEEE([]byte(s.bin)))
	if s.cred != nil {
		name += fmt.Sprintf("-%d", s.cred.Uid)
	}
	dir := filepath.Join(os.TempDir(), name)
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp("", name+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if s.cred != nil {
		os.Chmod(tmp, 0o755)
		if err := os.Chown(tmp, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return "", err
		}
	}
	data := filepath.Join(tmp, "data")
	if out, err := s.cmd("initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v\n%s", err, out)
	}
	if err := os.Rename(data, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(filepath.Join(dir, "PG_VERSION")); serr == nil {
			return dir, nil // another process won the race
		}
		return "", err
	}
	return dir, nil
}

// findBin finds the directory holding initdb and postgres.
func findBin() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(r))
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(found) - 1; i >= 0; i-- { // newest version first
		dirs = append(dirs, found[i])
	}
	for _, d := range dirs {
		ok := true
		for _, name := range []string{"initdb", "postgres"} {
			if _, err := os.Stat(filepath.Join(d, name)); err != nil {
				ok = false
			}
		}
		if ok {
			return d, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) in $PATH or /usr/lib/postgresql/*/bin")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
