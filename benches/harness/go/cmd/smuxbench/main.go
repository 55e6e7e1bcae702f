// Command smuxbench is a benchmark peer for github.com/xtaci/smux (v1.5.58)
// over plain TCP. A Rust orchestrator runs it to compare smux
// implementations, each library with its own client and server, so both
// sides here are stock xtaci/smux. The first argument picks the subcommand:
//
//	smuxbench serve      -listen HOST:PORT [-version 1|2] [-hold]
//	smuxbench throughput -addr HOST:PORT [-streams N] [-size S] [-warmup SECS] [-duration SECS] [-version 1|2]
//	smuxbench open       -addr HOST:PORT [-concurrency C] [-warmup SECS] [-duration SECS] [-version 1|2]
//	smuxbench idle       -addr HOST:PORT [-steps 1000,10000] [-version 1|2]
//
// serve accepts TCP connections until killed, one smux server session per
// connection. By default it echoes every stream; with -hold it keeps the
// streams (after reading the one byte each idle client stream carries and writing one back) and prints {"held":N} on stdout each time
// the process-wide count reaches a multiple of 1000 (for memory per idle
// stream).
//
// The client subcommands use one TCP connection and one smux client session:
//   - throughput: N streams, each with a writer pushing S-byte chunks and a
//     reader counting the echo; prints one JSON line with bytes/s of echo
//     received over the measured window.
//   - open: C workers loop OpenStream, write 1 byte, read 1 byte back, Close;
//     prints one JSON line with completed streams/s.
//   - idle: opens streams, writes 1 byte on each and reads the server's 1
//     byte back (serve -hold answers one), keeps them; prints
//     {"opened":N} at each step and waits for a line on stdin to go on.
//
// Measurements (throughput, open): after -warmup seconds the counter is read,
// after -duration more seconds it is read again; "secs" is the elapsed time
// measured with time.Now between the two reads, not the nominal duration.
// The program then exits at once without closing its streams.
//
// Session parameters (both sides, see sessionConfig): smux.DefaultConfig()
// with Version from -version, i.e. KeepAliveInterval 10 s, KeepAliveTimeout
// 30 s, MaxFrameSize 32768, MaxStreamBuffer 65536 (the v2 per-stream window
// announced in UPD frames) and MaxReceiveBuffer 4 MiB (the session-wide
// receive budget), except that version 2 raises MaxReceiveBuffer to 256 MiB.
//
// Output: JSON lines on stdout only; a start-up line and errors on stderr.
// Exit codes: 0 ok, 1 runtime error (connection, stream), 2 bad usage.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xtaci/smux"
)

const libName = "xtaci/smux"

func main() {
	if len(os.Args) < 2 {
		usage("missing subcommand")
	}
	cmd, args := os.Args[1], os.Args[2:]
	switch cmd {
	case "serve":
		serveCmd(args)
	case "throughput":
		throughputCmd(args)
	case "open":
		openCmd(args)
	case "idle":
		idleCmd(args)
	case "-h", "-help", "--help", "help":
		printUsage()
		os.Exit(0)
	default:
		usage("unknown subcommand " + strconv.Quote(cmd))
	}
}

func printUsage() {
	fmt.Fprint(os.Stderr, `usage: smuxbench SUBCOMMAND [flags]

  serve      -listen HOST:PORT [-version 1|2] [-hold]
  throughput -addr HOST:PORT [-streams N] [-size S] [-warmup SECS] [-duration SECS] [-version 1|2]
  open       -addr HOST:PORT [-concurrency C] [-warmup SECS] [-duration SECS] [-version 1|2]
  idle       -addr HOST:PORT [-steps N1,N2,...] [-version 1|2]

Run "smuxbench SUBCOMMAND -h" for the flags of one subcommand.
`)
}

// usage reports a bad command line and exits 2.
func usage(msg string) {
	fmt.Fprintln(os.Stderr, "smuxbench:", msg)
	printUsage()
	os.Exit(2)
}

// badFlag reports an invalid flag value of subcommand fs and exits 2.
func badFlag(fs *flag.FlagSet, msg string) {
	fmt.Fprintf(os.Stderr, "smuxbench %s: %s\n", fs.Name(), msg)
	fs.Usage()
	os.Exit(2)
}

// parse parses args into fs (exit 2 on a parse error, 0 on -h) and rejects
// positional arguments.
func parse(fs *flag.FlagSet, args []string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: smuxbench %s [flags]\n", fs.Name())
		fs.PrintDefaults()
	}
	fs.Parse(args) // ExitOnError
	if fs.NArg() > 0 {
		badFlag(fs, "unexpected argument "+strconv.Quote(fs.Arg(0)))
	}
}

// exitMu is locked for good by the first goroutine that ends the program
// (an error or the final report), so exactly one outcome is printed.
var exitMu sync.Mutex

// fail prints an error and exits 1.
func fail(format string, args ...any) {
	exitMu.Lock()
	fmt.Fprintf(os.Stderr, "smuxbench: "+format+"\n", args...)
	os.Exit(1)
}

// sessionConfig is the smux configuration of every session, client or
// server. Everything is smux.DefaultConfig() (v1.5.58, mux.go) except Version:
//
//	KeepAliveInterval  10 s      NOP frame period
//	KeepAliveTimeout   30 s      session dies if nothing arrives for this long
//	MaxFrameSize       32768     largest PSH payload sent
//	MaxStreamBuffer    65536     v2 only: per-stream window announced in UPD
//	MaxReceiveBuffer   4 MiB     session-wide receive budget (v1 and v2),
//	                             raised to 256 MiB for version 2, see below
func sessionConfig(version int) *smux.Config {
	cfg := smux.DefaultConfig()
	cfg.Version = version
	if version == 2 {
		// Stock smux v2 echo can deadlock once the session-wide budget is
		// used up: recvLoop stops reading the connection until streams
		// consume data, but the echo goroutines are blocked in Write waiting
		// for the peer's UPD (window update) frames, which only recvLoop
		// could read. Every peer stream may have 256 KiB in flight (the
		// initial window), so 4 MiB stalls with 16+ busy streams; 256 MiB
		// covers 1000. The client gets the same budget so both ends match.
		cfg.MaxReceiveBuffer = 256 << 20
	}
	if err := smux.VerifyConfig(cfg); err != nil {
		fail("smux config: %v", err)
	}
	return cfg
}

// versionFlag adds -version to fs.
func versionFlag(fs *flag.FlagSet) *int {
	return fs.Int("version", 1, "smux protocol version (1 or 2)")
}

func checkVersion(fs *flag.FlagSet, v int) {
	if v != 1 && v != 2 {
		badFlag(fs, fmt.Sprintf("-version must be 1 or 2, got %d", v))
	}
}

func checkAddr(fs *flag.FlagSet, name, addr string) {
	if addr == "" {
		badFlag(fs, "-"+name+" HOST:PORT is required")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		badFlag(fs, fmt.Sprintf("-%s %q: %v", name, addr, err))
	}
}

// ---------------------------------------------------------------- serve

// heldMu guards held and keeps the {"held":N} lines in order.
var (
	heldMu sync.Mutex
	held   int
)

func serveCmd(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "", "listen on `HOST:PORT` (port 0 picks a free port; the start-up line on stderr shows it)")
	version := versionFlag(fs)
	hold := fs.Bool("hold", false, "keep accepted streams (after one byte each way) without closing them, print {\"held\":N} every 1000 (default: echo)")
	parse(fs, args)
	checkAddr(fs, "listen", *listen)
	checkVersion(fs, *version)
	cfg := sessionConfig(*version)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fail("listen %s: %v", *listen, err)
	}
	mode := "echo"
	if *hold {
		mode = "hold"
	}
	fmt.Fprintf(os.Stderr, "smuxbench serve: listening on %s, %s, smux %s version=%d max-receive-buffer=%d max-stream-buffer=%d\n",
		ln.Addr(), mode, libName, cfg.Version, cfg.MaxReceiveBuffer, cfg.MaxStreamBuffer)

	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				fail("accept: %v", err)
			}
			// e.g. EMFILE: report, back off a little, keep serving
			fmt.Fprintf(os.Stderr, "smuxbench serve: accept: %v\n", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go serveConn(conn, cfg, *hold)
	}
}

// serveConn runs one smux server session until the connection ends.
func serveConn(conn net.Conn, cfg *smux.Config, hold bool) {
	sess, err := smux.Server(conn, cfg)
	if err != nil { // only config errors, already verified
		fmt.Fprintf(os.Stderr, "smuxbench serve: %v: smux.Server: %v\n", conn.RemoteAddr(), err)
		conn.Close()
		return
	}
	defer sess.Close()
	var kept []*smux.Stream // -hold: first byte read, then never read or closed
	defer func() {
		if len(kept) > 0 {
			heldMu.Lock()
			held -= len(kept)
			heldMu.Unlock()
		}
	}()
	for {
		st, err := sess.AcceptStream()
		if err != nil { // peer closed the connection, keepalive timeout, ...
			// The benchmark clients exit without closing their sessions, so
			// EOF (also mid-frame) and resets are the normal end: not logged.
			if !isNormalEnd(err) {
				fmt.Fprintf(os.Stderr, "smuxbench serve: %v: session ended: %v\n", conn.RemoteAddr(), err)
			}
			return
		}
		if hold {
			// Read the one byte the idle client wrote and write one back
			// (as the Rust servers do: yamux acknowledges a stream only
			// with the first frame it sends on it), then keep the stream
			// without a goroutine of its own.
			var first [1]byte
			if _, err := io.ReadFull(st, first[:]); err != nil {
				st.Close()
				continue
			}
			if _, err := st.Write(first[:]); err != nil {
				st.Close()
				continue
			}
			kept = append(kept, st)
			heldMu.Lock()
			held++
			if held%1000 == 0 {
				fmt.Printf("{\"held\":%d}\n", held) // os.Stdout is unbuffered
			}
			heldMu.Unlock()
			continue
		}
		go echo(st)
	}
}

func isNormalEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.ErrClosedPipe) || errors.Is(err, syscall.ECONNRESET)
}

// echo copies the stream back to itself until the peer's FIN (or an error),
// then closes it.
//
// Note: *smux.Stream implements io.WriterTo, so io.CopyBuffer hands the work
// to Stream.WriteTo, which writes the received frame buffers directly and
// leaves buf unused. This is the path any Go user of io.Copy gets.
func echo(st *smux.Stream) {
	buf := make([]byte, 32<<10)
	io.CopyBuffer(st, st, buf) // errors just end the echo
	st.Close()
}

// ---------------------------------------------------------------- clients

// dial connects to addr and starts an smux client session on it.
func dial(addr string, version int) *smux.Session {
	cfg := sessionConfig(version)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		fail("dial %s: %v", addr, err)
	}
	sess, err := smux.Client(conn, cfg)
	if err != nil {
		fail("smux.Client: %v", err)
	}
	return sess
}

// secsDur turns a float number of seconds into a Duration.
func secsDur(s float64) time.Duration {
	return time.Duration(s * float64(time.Second))
}

// measure waits warmup, reads counter, waits duration, reads it again and
// returns the difference and the measured elapsed seconds between the reads.
func measure(counter *atomic.Int64, warmup, duration float64) (int64, float64) {
	time.Sleep(secsDur(warmup))
	c0 := counter.Load()
	t0 := time.Now()
	time.Sleep(secsDur(duration))
	c1 := counter.Load()
	secs := time.Since(t0).Seconds()
	return c1 - c0, secs
}

// finish prints the result line and exits 0; errors racing with it are not
// printed.
func finish(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		fail("json: %v", err)
	}
	exitMu.Lock()
	os.Stdout.Write(append(line, '\n'))
	os.Exit(0)
}

// timingFlags adds -warmup and -duration to fs.
func timingFlags(fs *flag.FlagSet) (*float64, *float64) {
	return fs.Float64("warmup", 1, "seconds to run before measuring"),
		fs.Float64("duration", 5, "seconds to measure")
}

func checkTiming(fs *flag.FlagSet, warmup, duration float64) {
	if !(warmup >= 0) || warmup > 1e6 {
		badFlag(fs, fmt.Sprintf("-warmup must be >= 0 seconds, got %v", warmup))
	}
	if !(duration > 0) || duration > 1e6 {
		badFlag(fs, fmt.Sprintf("-duration must be > 0 seconds, got %v", duration))
	}
}

func throughputCmd(args []string) {
	fs := flag.NewFlagSet("throughput", flag.ExitOnError)
	addr := fs.String("addr", "", "dial `HOST:PORT` (a smuxbench serve or another echo server)")
	streams := fs.Int("streams", 1, "streams, each with one writer and one reader goroutine")
	size := fs.Int("size", 16384, "bytes per Write call")
	warmup, duration := timingFlags(fs)
	version := versionFlag(fs)
	parse(fs, args)
	checkAddr(fs, "addr", *addr)
	if *streams < 1 {
		badFlag(fs, fmt.Sprintf("-streams must be >= 1, got %d", *streams))
	}
	if *size < 1 {
		badFlag(fs, fmt.Sprintf("-size must be >= 1, got %d", *size))
	}
	checkTiming(fs, *warmup, *duration)
	checkVersion(fs, *version)

	sess := dial(*addr, *version)
	// One shared payload of pseudo-random bytes (fixed seed), written by all
	// writers; smux copies it into frames, so sharing is safe.
	payload := make([]byte, *size)
	rand.NewChaCha8([32]byte{'s', 'm', 'u', 'x'}).Read(payload)

	var received atomic.Int64 // echoed bytes read, all streams
	sts := make([]*smux.Stream, *streams)
	for i := range sts {
		st, err := sess.OpenStream()
		if err != nil {
			fail("OpenStream %d of %d: %v", i+1, *streams, err)
		}
		sts[i] = st
	}
	for _, st := range sts {
		go func() {
			for {
				if _, err := st.Write(payload); err != nil {
					fail("stream %d: write: %v", st.ID(), err)
				}
			}
		}()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := st.Read(buf)
				received.Add(int64(n))
				if err != nil {
					fail("stream %d: read: %v", st.ID(), err)
				}
			}
		}()
	}

	bytes, secs := measure(&received, *warmup, *duration)
	finish(struct {
		Lib         string  `json:"lib"`
		Version     int     `json:"version"`
		Streams     int     `json:"streams"`
		Size        int     `json:"size"`
		Bytes       int64   `json:"bytes"`
		Secs        float64 `json:"secs"`
		BytesPerSec float64 `json:"bytes_per_sec"`
	}{libName, *version, *streams, *size, bytes, secs, float64(bytes) / secs})
}

func openCmd(args []string) {
	fs := flag.NewFlagSet("open", flag.ExitOnError)
	addr := fs.String("addr", "", "dial `HOST:PORT` (a smuxbench serve or another echo server)")
	concurrency := fs.Int("concurrency", 10, "workers, each looping OpenStream, write 1 byte, read 1 byte, Close")
	warmup, duration := timingFlags(fs)
	version := versionFlag(fs)
	parse(fs, args)
	checkAddr(fs, "addr", *addr)
	if *concurrency < 1 {
		badFlag(fs, fmt.Sprintf("-concurrency must be >= 1, got %d", *concurrency))
	}
	checkTiming(fs, *warmup, *duration)
	checkVersion(fs, *version)

	sess := dial(*addr, *version)
	var done atomic.Int64 // completed open/write/read/close loops
	for range *concurrency {
		go func() {
			out, in := []byte{'x'}, make([]byte, 1)
			for {
				st, err := sess.OpenStream()
				if err != nil {
					fail("OpenStream: %v", err)
				}
				if _, err := st.Write(out); err != nil {
					fail("stream %d: write: %v", st.ID(), err)
				}
				if _, err := io.ReadFull(st, in); err != nil {
					fail("stream %d: read: %v", st.ID(), err)
				}
				// Full close: sends FIN and drops the stream (the echo server
				// closes its side when it sees the FIN).
				st.Close()
				done.Add(1)
			}
		}()
	}

	streams, secs := measure(&done, *warmup, *duration)
	finish(struct {
		Lib           string  `json:"lib"`
		Version       int     `json:"version"`
		Concurrency   int     `json:"concurrency"`
		Streams       int64   `json:"streams"`
		Secs          float64 `json:"secs"`
		StreamsPerSec float64 `json:"streams_per_sec"`
	}{libName, *version, *concurrency, streams, secs, float64(streams) / secs})
}

func idleCmd(args []string) {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	addr := fs.String("addr", "", "dial `HOST:PORT` (normally smuxbench serve -hold)")
	stepsFlag := fs.String("steps", "1000,10000", "comma-separated, increasing stream counts at which to print {\"opened\":N} and wait for a stdin line")
	version := versionFlag(fs)
	parse(fs, args)
	checkAddr(fs, "addr", *addr)
	var steps []int
	for _, f := range strings.Split(*stepsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			badFlag(fs, fmt.Sprintf("-steps: %q is not a positive integer", f))
		}
		if len(steps) > 0 && n <= steps[len(steps)-1] {
			badFlag(fs, fmt.Sprintf("-steps must be strictly increasing, got %d after %d", n, steps[len(steps)-1]))
		}
		steps = append(steps, n)
	}
	checkVersion(fs, *version)

	sess := dial(*addr, *version)
	stdin := bufio.NewReader(os.Stdin)
	// waitLine blocks until a line (or EOF) arrives on stdin; it reports
	// whether stdin is still open.
	waitLine := func() bool {
		_, err := stdin.ReadString('\n')
		return err == nil
	}

	var kept []*smux.Stream
	one, back := []byte{'x'}, make([]byte, 1)
	for i, step := range steps {
		for len(kept) < step {
			st, err := sess.OpenStream()
			if err != nil {
				fail("OpenStream %d: %v", len(kept)+1, err)
			}
			if _, err := st.Write(one); err != nil {
				fail("stream %d: write: %v", st.ID(), err)
			}
			// The server's one byte back: read, so that nothing waits in
			// a receive buffer (as the Rust clients do).
			if _, err := io.ReadFull(st, back); err != nil {
				fail("stream %d: read: %v", st.ID(), err)
			}
			kept = append(kept, st) // never used again, never closed
		}
		fmt.Printf("{\"opened\":%d}\n", len(kept))
		open := waitLine()
		if i == len(steps)-1 {
			break // the last step's line (or EOF) ends the run
		}
		if !open {
			// stdin closed early: the orchestrator is gone, stop here
			fmt.Fprintf(os.Stderr, "smuxbench idle: stdin closed at %d streams, exiting\n", len(kept))
			break
		}
	}
	os.Exit(0)
}
