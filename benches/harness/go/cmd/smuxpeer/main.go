// Command smuxpeer is an independent smux peer (github.com/xtaci/smux
// v1.5.58) for interop tests against rapidws's smux implementation. It runs
// one smux session over a TCP connection or a WebSocket (binary messages,
// one smux frame per message when sending) and either checks echoed streams
// (echo-check, accept-check), echoes the streams the other side opens
// (echo-serve), or opens streams, writes on them and never reads them
// (hold: a hostile peer for the other side's memory bounds and keepalive).
// See ../../README.md for the flags.
//
// Half-close in smux v1.5.58: Stream.CloseWrite (stream.go:726) sends FIN
// and leaves the read side open, so the echo can still be read until the
// peer's FIN turns into io.EOF; later Writes fail with io.ErrClosedPipe.
// Stream.Close (stream.go:750) is a full close: it also sends FIN, but marks
// the stream as forcibly closed and drops it from the session (buffered data
// discarded), so every later Read returns io.ErrClosedPipe. This program
// therefore half-closes with CloseWrite. A FIN received from the peer only
// ends the read side (stream.go:895); writing stays allowed.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/xtaci/smux"
)

var (
	def = smux.DefaultConfig()

	tcpAddr   = flag.String("tcp", "", "dial `HOST:PORT` and run smux over plain TCP")
	overTLS   = flag.Bool("tls", false, "with -tcp: TLS first (ALPN smux, the certificate not checked: a test peer)")
	wsURL     = flag.String("url", "", "dial the WebSocket `URL` (ws://HOST:PORT/mux) and run smux over binary messages")
	listen    = flag.String("listen", "", "listen on `HOST:PORT`, accept one connection and run smux on it")
	useWS     = flag.Bool("ws", false, "with -listen: serve a WebSocket (any path) instead of plain TCP")
	version   = flag.Int("version", 1, "smux protocol version (1 or 2)")
	role      = flag.String("role", "", "smux side: client (odd stream ids) or server (even); default client when dialling, server with -listen")
	mode      = flag.String("mode", "echo-check", "echo-check, accept-check, echo-serve or hold")
	nStreams  = flag.Int("streams", 100, "echo-check: streams to open; accept-check: streams to accept")
	nOpen     = flag.Int("open", 0, "echo-serve: also open this many streams and echo-check them")
	maxSize   = flag.Int("max-size", 1<<20, "largest random payload per checked stream, bytes")
	seedFlag  = flag.Uint64("seed", 0, "PRNG seed (default: time-based)")
	timeout   = flag.Duration("timeout", 60*time.Second, "give up after this long, print what is pending and exit 2 (0: never)")
	kaIval    = flag.Duration("keepalive-interval", def.KeepAliveInterval, "smux KeepAliveInterval (NOP period)")
	kaTimeout = flag.Duration("keepalive-timeout", def.KeepAliveTimeout, "smux KeepAliveTimeout")
	noKA      = flag.Bool("no-keepalive", false, "smux KeepAliveDisabled")
	maxFrame  = flag.Int("max-frame", def.MaxFrameSize, "smux MaxFrameSize (largest PSH payload sent)")
	streamBuf = flag.Int("stream-buffer", def.MaxStreamBuffer, "smux MaxStreamBuffer (v2 window announced in UPD)")
	recvBuf   = flag.Int("recv-buffer", def.MaxReceiveBuffer, "smux MaxReceiveBuffer (session-wide receive budget; echo-serve -version 2 defaults to 256 MiB)")
)

var seed uint64

func main() {
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	seed = *seedFlag
	if !set["seed"] {
		seed = uint64(time.Now().UnixNano())
	}
	dialled := *tcpAddr != "" || *wsURL != ""
	switch {
	case countSet(*tcpAddr, *wsURL, *listen) != 1:
		usage("exactly one of -tcp, -url, -listen is required")
	case *useWS && *listen == "":
		usage("-ws needs -listen (use -url to dial a WebSocket)")
	case *mode != "echo-check" && *mode != "accept-check" && *mode != "echo-serve" && *mode != "hold":
		usage("unknown -mode " + *mode)
	case *maxSize < 0 || *nStreams < 0 || *nOpen < 0:
		usage("-max-size, -streams and -open must not be negative")
	}
	if *role == "" {
		*role = "server"
		if dialled {
			*role = "client"
		}
	}
	if *role != "client" && *role != "server" {
		usage("-role must be client or server")
	}
	cfg := smux.DefaultConfig()
	cfg.Version = *version
	cfg.KeepAliveInterval, cfg.KeepAliveTimeout, cfg.KeepAliveDisabled = *kaIval, *kaTimeout, *noKA
	cfg.MaxFrameSize, cfg.MaxStreamBuffer, cfg.MaxReceiveBuffer = *maxFrame, *streamBuf, *recvBuf
	if (*mode == "echo-serve" || *mode == "hold") && *version == 2 && !set["recv-buffer"] {
		// A v2 echo server with stock buffers can deadlock: once the
		// session-wide budget (MaxReceiveBuffer) is used up, recvLoop stops
		// reading the connection (session.go:434) until streams consume data,
		// but the echo streams are blocked in Write waiting for the peer's UPD
		// (stream.go:706), which only recvLoop could read. Each peer stream
		// may have 256 KiB in flight (initialPeerWindow, frame.go:50), so 4 MiB
		// stalls with 16+ busy streams; 256 MiB covers 1000.
		cfg.MaxReceiveBuffer = 256 << 20
	}
	if err := smux.VerifyConfig(cfg); err != nil {
		usage("smux config: " + err.Error())
	}
	fmt.Fprintf(os.Stderr, "smuxpeer: seed=%d version=%d role=%s mode=%s recv-buffer=%d\n",
		seed, *version, *role, *mode, cfg.MaxReceiveBuffer)

	if *timeout > 0 {
		time.AfterFunc(*timeout, func() {
			exitMu.Lock()
			fmt.Fprintf(os.Stderr, "TIMEOUT after %v (seed=%d); pending:\n", *timeout, seed)
			track.dump(os.Stderr)
			os.Exit(2)
		})
	}

	track.note("connect", func() string { return "no connection yet" })
	conn, err := connect()
	if err != nil {
		fail("connect: %v", err)
	}
	track.note("connect", nil)
	newSession := smux.Client
	if *role == "server" {
		newSession = smux.Server
	}
	sess, err := newSession(conn, cfg)
	if err != nil {
		fail("smux session: %v", err)
	}

	start := time.Now()
	switch *mode {
	case "echo-check":
		report(*nStreams, openChecks(sess, *nStreams), start)
		shutdown(sess, conn)
	case "accept-check":
		report(*nStreams, acceptChecks(sess, *nStreams), start)
		shutdown(sess, conn)
	case "echo-serve":
		echoServe(sess, start)
	case "hold":
		hold(sess, start)
	}
}

func countSet(ss ...string) (n int) {
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

func usage(msg string) {
	fmt.Fprintln(os.Stderr, "smuxpeer:", msg)
	flag.Usage()
	os.Exit(64)
}

// exitMu is locked for good by the first goroutine that exits with an error,
// so exactly one failure (or the timeout report) is printed.
var exitMu sync.Mutex

func fail(format string, args ...any) {
	exitMu.Lock()
	fmt.Fprintf(os.Stderr, "FAIL: "+format+" (seed=%d)\n", append(args, seed)...)
	os.Exit(1)
}

func report(streams int, bytes int64, start time.Time) {
	fmt.Printf("ok streams=%d bytes=%d elapsed=%.3fs seed=%d version=%d\n",
		streams, bytes, time.Since(start).Seconds(), seed, *version)
}

// connect dials (-tcp, -url) or accepts one connection (-listen).
func connect() (net.Conn, error) {
	switch {
	case *tcpAddr != "" && *overTLS:
		conn, err := tls.Dial("tcp", *tcpAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"smux"}})
		if err != nil {
			return nil, err
		}
		if got := conn.ConnectionState().NegotiatedProtocol; got != "smux" {
			conn.Close()
			return nil, fmt.Errorf("ALPN: the server chose %q, not smux", got)
		}
		return conn, nil
	case *tcpAddr != "":
		return net.Dial("tcp", *tcpAddr)
	case *wsURL != "":
		c, _, err := websocket.Dial(context.Background(), *wsURL, nil)
		if err != nil {
			return nil, err
		}
		c.SetReadLimit(-1) // NetConn does this too; smux frames span messages freely
		return websocket.NetConn(context.Background(), c, websocket.MessageBinary), nil
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	if !*useWS {
		fmt.Printf("listening %s\n", ln.Addr()) // os.Stdout is unbuffered
		return ln.Accept()
	}
	conns := make(chan net.Conn, 1)
	var mu sync.Mutex
	taken := false
	handler := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if taken {
			http.Error(w, "smuxpeer serves one connection", http.StatusServiceUnavailable)
			return
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil { // Accept has written the HTTP error; keep waiting
			fmt.Fprintln(os.Stderr, "smuxpeer: websocket accept:", err)
			return
		}
		c.SetReadLimit(-1)
		taken = true
		// The connection is hijacked, so the handler may return.
		conns <- websocket.NetConn(context.Background(), c, websocket.MessageBinary)
	}
	srv := &http.Server{Handler: http.HandlerFunc(handler), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) // returns when connect closes ln
	fmt.Printf("listening %s\n", ln.Addr())
	return <-conns, nil
}

// shutdown ends the session once every check is done. For plain TCP it
// first half-closes the socket and waits (briefly) for the peer's EOF, so
// frames still in flight towards us are read instead of provoking an RST.
// Over a WebSocket, Session.Close sends a normal-closure close frame.
func shutdown(sess *smux.Session, conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok && tc.CloseWrite() == nil {
		sess.SetDeadline(time.Now().Add(2 * time.Second))
		for {
			st, err := sess.AcceptStream() // returns the socket read error at EOF
			if err != nil {
				break
			}
			st.Close()
		}
	}
	done := make(chan struct{})
	go func() { sess.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
}

// check is one stream whose echo is verified against what was written.
type check struct {
	idx   int
	data  []byte
	rng   *rand.Rand // chunk sizes; used by the writer goroutine only
	id    atomic.Uint32
	wrote atomic.Int64
	read  atomic.Int64
	done  atomic.Bool
}

// newCheck derives the payload of check idx from the seed alone: check 0 is
// empty, 1 has one byte, 2 has -max-size bytes, the rest are uniform in
// [0, max-size].
func newCheck(idx int) *check {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	binary.LittleEndian.PutUint64(key[8:], uint64(idx))
	src := rand.NewChaCha8(key)
	rng := rand.New(src)
	size := rng.IntN(*maxSize + 1)
	switch idx {
	case 0, 1:
		size = min(idx, *maxSize)
	case 2:
		size = *maxSize
	}
	c := &check{idx: idx, data: make([]byte, size), rng: rng}
	src.Read(c.data) // ChaCha8.Read never fails
	track.add(c)
	return c
}

func (c *check) String() string {
	return fmt.Sprintf("stream %d (check #%d, %d bytes)", c.id.Load(), c.idx, len(c.data))
}

// run writes the payload in random chunks while reading the echo, then
// half-closes and reads until EOF; any deviation ends the program.
func (c *check) run(st *smux.Stream) {
	c.id.Store(st.ID())
	wdone := make(chan error, 1)
	go func() {
		for rest := c.data; len(rest) > 0; {
			n := min(c.chunk(), len(rest))
			w, err := st.Write(rest[:n])
			c.wrote.Add(int64(w))
			if err != nil {
				wdone <- fmt.Errorf("write at offset %d: %w", c.wrote.Load(), err)
				return
			}
			rest = rest[n:]
		}
		if err := st.CloseWrite(); err != nil {
			wdone <- fmt.Errorf("CloseWrite: %w", err)
			return
		}
		wdone <- nil
	}()
	buf := make([]byte, 32<<10)
	off := 0
	for {
		n, err := st.Read(buf)
		if n > 0 {
			if off+n > len(c.data) {
				fail("%v: echo has extra data at offset %d (%d bytes read)", c, len(c.data), off+n)
			}
			if got, want := buf[:n], c.data[off:off+n]; !bytes.Equal(got, want) {
				i := 0
				for got[i] == want[i] {
					i++
				}
				fail("%v: mismatch at offset %d: got %#02x, want %#02x", c, off+i, got[i], want[i])
			}
			off += n
			c.read.Store(int64(off))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			fail("%v: read at offset %d: %v", c, off, err)
		}
	}
	if off != len(c.data) {
		fail("%v: EOF after %d of %d bytes", c, off, len(c.data))
	}
	if err := <-wdone; err != nil {
		fail("%v: %v", c, err)
	}
	c.done.Store(true)
}

// chunk picks a write size: tiny, small or up to several frames.
func (c *check) chunk() int {
	switch c.rng.IntN(4) {
	case 0:
		return 1 + c.rng.IntN(64)
	case 1:
		return 1 + c.rng.IntN(4096)
	default:
		return 1 + c.rng.IntN(256<<10)
	}
}

// openChecks opens n streams concurrently and checks the echo on each.
func openChecks(sess *smux.Session, n int) int64 {
	checks := make([]*check, n)
	for i := range checks {
		checks[i] = newCheck(i)
	}
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Go(func() {
			st, err := sess.OpenStream()
			if err != nil {
				fail("check #%d: OpenStream: %v", c.idx, err)
			}
			c.run(st)
		})
	}
	wg.Wait()
	return total(checks)
}

// acceptChecks first opens a stream and round-trips "hello" on it, so our
// SYN is the first frame the peer sees (it adopts our version from it), and
// meanwhile accepts n streams and checks the echo on each.
func acceptChecks(sess *smux.Session, n int) int64 {
	hello := make(chan struct{})
	go func() {
		track.note("hello", func() string { return "hello round trip on our own stream" })
		st, err := sess.OpenStream()
		if err != nil {
			fail("hello: OpenStream: %v", err)
		}
		got := make([]byte, 5)
		if _, err := st.Write([]byte("hello")); err != nil {
			fail("hello: stream %d: write: %v", st.ID(), err)
		}
		if _, err := io.ReadFull(st, got); err != nil || string(got) != "hello" {
			fail("hello: stream %d: read %q: %v", st.ID(), got, err)
		}
		st.CloseWrite()
		if rest, err := io.ReadAll(st); err != nil || len(rest) > 0 {
			fail("hello: stream %d: after FIN read %d more bytes: %v", st.ID(), len(rest), err)
		}
		track.note("hello", nil)
		close(hello)
	}()

	checks := make([]*check, n)
	for i := range checks {
		checks[i] = newCheck(i)
	}
	var accepted atomic.Int64
	track.note("accept", func() string { return fmt.Sprintf("accepted %d of %d streams", accepted.Load(), n) })
	var wg sync.WaitGroup
	for _, c := range checks {
		st, err := sess.AcceptStream()
		if err != nil {
			fail("AcceptStream after %d of %d streams: %v", accepted.Load(), n, err)
		}
		accepted.Add(1)
		wg.Go(func() { c.run(st) })
	}
	track.note("accept", nil)
	wg.Wait()
	<-hello
	return total(checks)
}

// echoServe echoes every stream the peer opens until the session ends, and
// with -open N also runs N echo checks of its own.
func echoServe(sess *smux.Session, start time.Time) {
	checked := make(chan struct{})
	if *nOpen > 0 {
		go func() {
			report(*nOpen, openChecks(sess, *nOpen), start)
			close(checked)
		}()
	} else {
		close(checked)
	}
	var accepted, open, echoed atomic.Int64
	track.note("echo", func() string {
		return fmt.Sprintf("echo-serve: %d streams accepted, %d still open, %d bytes echoed",
			accepted.Load(), open.Load(), echoed.Load())
	})
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fail("echo-serve: session ended: %v", err)
			}
			break
		}
		accepted.Add(1)
		open.Add(1)
		go func() {
			defer open.Add(-1)
			// io.Copy uses Stream.WriteTo; it returns at the peer's FIN.
			n, err := io.Copy(st, st)
			echoed.Add(n)
			if err != nil {
				fmt.Fprintf(os.Stderr, "smuxpeer: echo stream %d: %v\n", st.ID(), err)
				st.Close()
				return
			}
			st.CloseWrite()
		}()
	}
	<-checked // the session is gone, so unfinished checks fail promptly
	fmt.Fprintf(os.Stderr, "smuxpeer: session closed by peer; echoed %d streams, %d bytes\n",
		accepted.Load(), echoed.Load())
	sess.Close()
}

// hold opens -streams streams and writes -max-size bytes on each (as far as
// the peer's windows let it), never reads any of them, and waits for the
// session to end: a peer whose application never reads, while smux itself
// reads the connection (with -version 2 and no -recv-buffer its receive
// budget is 256 MiB, so it keeps reading) and sends a NOP every
// -keepalive-interval. Prints `holding streams=N` once they are open (fewer
// if the session ended first), and `closed after=SECONDS wrote=BYTES` when
// the other side ends the session (exit 0).
func hold(sess *smux.Session, start time.Time) {
	payload := make([]byte, *maxSize)
	for i := range payload {
		payload[i] = byte(i)
	}
	var wrote atomic.Int64
	track.note("hold", func() string {
		return fmt.Sprintf("hold: %d streams, %d bytes written, session open", *nStreams, wrote.Load())
	})
	streams := make([]*smux.Stream, 0, *nStreams)
	for i := 0; i < *nStreams; i++ {
		st, err := sess.OpenStream()
		if err != nil {
			// The other side may end the session meanwhile: hold what opened.
			fmt.Fprintf(os.Stderr, "smuxpeer: hold: OpenStream %d: %v\n", i, err)
			break
		}
		streams = append(streams, st)
		go func() {
			n, _ := st.Write(payload) // blocks while the peer gives no window
			wrote.Add(int64(n))
		}()
	}
	fmt.Printf("holding streams=%d\n", len(streams))
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		st.Close()
	}
	fmt.Printf("closed after=%.1f wrote=%d\n", time.Since(start).Seconds(), wrote.Load())
	sess.Close()
}

func total(checks []*check) (n int64) {
	for _, c := range checks {
		n += int64(len(c.data))
	}
	return n
}

// tracker knows what is still pending, for the timeout report.
type tracker struct {
	mu     sync.Mutex
	checks []*check
	notes  map[string]func() string
}

var track = &tracker{notes: map[string]func() string{}}

func (t *tracker) add(c *check) {
	t.mu.Lock()
	t.checks = append(t.checks, c)
	t.mu.Unlock()
}

// note sets (or with f == nil, removes) a pending item described by f.
func (t *tracker) note(key string, f func() string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f == nil {
		delete(t.notes, key)
	} else {
		t.notes[key] = f
	}
}

func (t *tracker) dump(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, f := range t.notes {
		lines = append(lines, "  "+f())
	}
	sort.Strings(lines)
	for _, c := range t.checks {
		if c.done.Load() {
			continue
		}
		state := "not opened/accepted yet"
		if c.id.Load() != 0 {
			state = fmt.Sprintf("Write calls returned %d bytes, read back %d", c.wrote.Load(), c.read.Load())
		}
		lines = append(lines, fmt.Sprintf("  %v: %s", c, state))
	}
	fmt.Fprintln(w, strings.Join(lines, "\n"))
}
