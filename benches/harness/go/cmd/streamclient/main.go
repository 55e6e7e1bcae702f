// Command streamclient is a Go client for the stream scenario, in the spirit
// of the "WebSocket Stream Benchmark"'s own client: a Go program on
// github.com/gorilla/websocket, run unpinned with the default GOMAXPROCS. It
// exists so the Rust benchmark runner can measure a server with a Go client
// as well as with the Rust load generator (`rapidws-load stream`), whose
// output it copies line for line.
//
//	streamclient -url ws://HOST:PORT/ [-interval 10ms] [-requests 1000]
//	             [-size 36] [-warmup 1s] [-grace 5s] [-whole]
//
// One WebSocket connection to a server that pushes large binary messages on
// a timer and echoes every message the client sends. One goroutine reads
// every message as fast as it comes: binary messages are pushes (counted,
// payload discarded; with -whole each read into a new buffer, as the
// Stream Benchmark's client reads them), text messages are replies to our
// requests, matched to their request by content (the request's number).
// After -warmup the main goroutine, the only writer, sends -requests text
// requests, one per -interval (a time.Ticker; the first at once), each its
// number zero-padded to -size bytes, and records the send time just before each write. Replies
// may come up to -grace after the last request; the ones still missing then
// count as missing.
//
// Output, on stdout, exactly as the Rust load generator prints it:
//
//	{"event":"measure"}                  when the first request is about to go
//	{"avg_us":...,"client":"go-gorilla",...}   one result line at the end
//
// The result's keys (printed sorted, as serde_json prints them): completed, per_sec,
// secs, avg_us, p50_us, p99_us, p999_us, max_us, errors, first_error, mode
// ("stream"), conns (1), requests, missing, pushes_per_sec, push_mb_per_sec,
// client ("go-gorilla"). "secs" runs from the first request to just after
// the last send; pushes are counted over that window only, replies until
// the end of the grace period. Round trips are in microseconds; percentiles
// are nearest-rank over all samples (index ceil(q*n)-1 of the sorted list).
//
// A connection error once measuring has started (or a reply that matches no
// request, or a second reply to one) is counted in errors/first_error and
// the result is still printed; one before that goes to stderr with exit 1.
// At the end the client sends a close frame (best effort), waits up to 1 s
// for the server's close reply, and exits 0.
//
// Exit codes: 0 result printed, 1 connection error before measuring, 2 bad
// flags.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

const (
	progName   = "streamclient"
	clientName = "go-gorilla"
	// minSize is the smallest request: wide enough for any uint64 number
	// (20 digits), as the Rust load generator pads to at least 20 bytes.
	minSize = 20
)

func main() {
	opts := parseFlags()

	conn, _, err := websocket.DefaultDialer.Dial(opts.url, nil)
	if err != nil {
		fail("dial %s: %v", opts.url, err)
	}
	defer conn.Close()

	st := newRun(opts.requests)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		st.readLoop(conn, opts.whole)
	}()

	time.Sleep(opts.warmup)
	st.startMeasuring() // exits 1 instead if the reader already failed
	os.Stdout.Write([]byte("{\"event\":\"measure\"}\n"))

	start := time.Now()
	st.sendRequests(conn, opts)
	secs := time.Since(start).Seconds()
	st.measuring.Store(false)
	pushes, pushBytes := st.pushes.Load(), st.pushBytes.Load()

	// Wait for the replies still on their way, unless the reader has died
	// (then none can come).
	grace := time.NewTimer(opts.grace)
	select {
	case <-st.allIn:
	case <-readerDone:
	case <-grace.C:
	}
	grace.Stop()

	result := st.finish(secs)
	result["pushes_per_sec"] = jsonFloat(float64(pushes) / secs)
	result["push_mb_per_sec"] = jsonFloat(float64(pushBytes) / secs / 1e6)
	emit(result)

	// Best effort: send a normal close, give the server a moment to answer
	// it (the reader sees the reply and ends), then drop the connection.
	closeMsg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	if conn.WriteControl(websocket.CloseMessage, closeMsg, time.Now().Add(time.Second)) == nil {
		select {
		case <-readerDone:
		case <-time.After(time.Second):
		}
	}
}

// options are the validated command-line flags.
type options struct {
	url      string
	interval time.Duration
	requests int
	size     int
	warmup   time.Duration
	grace    time.Duration
	whole    bool
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.url, "url", "", "server URL, ws://HOST:PORT/PATH or wss://... (required)")
	flag.DurationVar(&o.interval, "interval", 10*time.Millisecond, "time between requests")
	flag.IntVar(&o.requests, "requests", 1000, "requests to send")
	flag.IntVar(&o.size, "size", 36, "request payload bytes: the request's number zero-padded to this width (at least 20)")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "pushes run this long before the first request")
	flag.DurationVar(&o.grace, "grace", 5*time.Second, "how long to wait for replies after the last request")
	flag.BoolVar(&o.whole, "whole", false, "read each push whole into a new buffer (conn.ReadMessage), as the Stream Benchmark's own client does, instead of draining it")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s -url ws://HOST:PORT/ [flags]\n", progName)
		flag.PrintDefaults()
	}
	flag.Parse() // ExitOnError: exit 2 on a malformed flag, 0 on -h

	switch {
	case flag.NArg() > 0:
		badFlag("unexpected argument " + strconv.Quote(flag.Arg(0)))
	case o.url == "":
		badFlag("-url is required")
	case o.interval <= 0:
		badFlag("-interval must be positive, got " + o.interval.String())
	case o.requests <= 0:
		badFlag(fmt.Sprintf("-requests must be positive, got %d", o.requests))
	case o.size < minSize:
		badFlag(fmt.Sprintf("-size must be at least %d, got %d", minSize, o.size))
	case o.warmup < 0:
		badFlag("-warmup must not be negative, got " + o.warmup.String())
	case o.grace < 0:
		badFlag("-grace must not be negative, got " + o.grace.String())
	}
	u, err := url.Parse(o.url)
	if err != nil {
		badFlag(fmt.Sprintf("-url %q: %v", o.url, err))
	}
	if (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		badFlag(fmt.Sprintf("-url %q: want ws://HOST:PORT/ or wss://HOST:PORT/", o.url))
	}
	return o
}

// badFlag reports an invalid command line and exits 2.
func badFlag(msg string) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", progName, msg)
	flag.Usage()
	os.Exit(2)
}

// fail prints an error and exits 1.
func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, progName+": "+format+"\n", args...)
	os.Exit(1)
}

// Phases of a run. Errors in phaseWarmup end the program; in phaseMeasure
// they are counted; in phaseDone (the result is being printed or the
// connection closed) they are ignored.
const (
	phaseWarmup = iota
	phaseMeasure
	phaseDone
)

// runState is the state shared by the reader goroutine and the main goroutine.
type runState struct {
	requests int

	// measuring is true from the first request to just after the last
	// send: pushes are counted only then.
	measuring atomic.Bool
	pushes    atomic.Int64
	pushBytes atomic.Int64

	mu         sync.Mutex
	phase      int
	pending    map[uint64]time.Time // sent, not answered yet
	nextNumber uint64               // numbers below it have been sent
	rtts       []int64              // round trips in ns, one per reply
	errors     int
	firstError *string
	allIn      chan struct{} // closed when every request has its reply
}

func newRun(requests int) *runState {
	return &runState{
		requests: requests,
		pending:  make(map[uint64]time.Time, requests),
		rtts:     make([]int64, 0, requests),
		allIn:    make(chan struct{}),
	}
}

// startMeasuring ends the warm-up. It takes the lock a failing reader holds
// while exiting, so a connection error during warm-up never gets as far as
// the "measure" line.
func (r *runState) startMeasuring() {
	r.mu.Lock()
	r.phase = phaseMeasure
	r.mu.Unlock()
	r.measuring.Store(true)
}

// failure records err: fatal during warm-up, counted while measuring,
// ignored once done.
func (r *runState) failure(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.phase {
	case phaseWarmup:
		fail("%v (before measuring)", err) // exits holding the lock
	case phaseMeasure:
		r.errors++
		if r.firstError == nil {
			msg := err.Error()
			r.firstError = &msg
		}
	}
}

// sendRequests sends the requests, one per interval, from the calling
// goroutine (the connection's only data writer). It stops at the first
// failed write, which is counted as an error.
func (r *runState) sendRequests(conn *websocket.Conn, o options) {
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	payload := make([]byte, 0, o.size)
	for n := 0; n < o.requests; n++ {
		if n > 0 {
			<-ticker.C
		}
		payload = fmt.Appendf(payload[:0], "%0*d", o.size, n)
		r.mu.Lock()
		r.pending[uint64(n)] = time.Now()
		r.nextNumber = uint64(n) + 1
		r.mu.Unlock()
		if err := conn.WriteMessage(websocket.TextMessage, payload); err != nil {
			r.failure(fmt.Errorf("sending request %d: %w", n, err))
			return
		}
	}
}

// readLoop reads every message until the connection fails: pushes are
// drained into io.Discard (no copy into a buffer of our own), or with
// whole read into a new buffer each (io.ReadAll, as conn.ReadMessage does
// in the Stream Benchmark's client: garbage for Go's collector, so the
// client reads more slowly); replies are matched to their request.
func (r *runState) readLoop(conn *websocket.Conn, whole bool) {
	var text bytes.Buffer // reused: replies are small
	for {
		op, rd, err := conn.NextReader()
		if err != nil {
			r.failure(readError(err))
			return
		}
		switch op {
		case websocket.BinaryMessage:
			n, err := drain(rd, whole)
			if err != nil {
				r.failure(readError(err))
				return
			}
			if r.measuring.Load() {
				r.pushes.Add(1)
				r.pushBytes.Add(n)
			}
		case websocket.TextMessage:
			text.Reset()
			if _, err := text.ReadFrom(rd); err != nil {
				r.failure(readError(err))
				return
			}
			if err := r.reply(text.Bytes(), time.Now()); err != nil {
				r.failure(err) // counted; keep reading
			}
		}
	}
}

// drain reads a push to its end: into io.Discard, or with whole into a
// buffer of its own; the bytes read.
func drain(rd io.Reader, whole bool) (int64, error) {
	if !whole {
		return io.Copy(io.Discard, rd)
	}
	message, err := io.ReadAll(rd)
	return int64(len(message)), err
}

// readError names what failed; a close frame from the server is reported
// as such rather than as gorilla's bare "websocket: close 1000" (gorilla's
// 1006 "abnormal closure" means the connection ended without one).
func readError(err error) error {
	var closeErr *websocket.CloseError
	if errors.As(err, &closeErr) && closeErr.Code != websocket.CloseAbnormalClosure {
		return fmt.Errorf("server sent close: %v", err)
	}
	return fmt.Errorf("reading: %w", err)
}

// reply records the round trip of the request whose number is text.
func (r *runState) reply(text []byte, at time.Time) error {
	number, err := strconv.ParseUint(string(text), 10, 64)
	if err != nil {
		return fmt.Errorf("a reply that is no request's: %s", quoteShort(text))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sent, ok := r.pending[number]
	if !ok {
		if number < r.nextNumber {
			return fmt.Errorf("a second reply to request %d", number)
		}
		return fmt.Errorf("a reply to request %d, which was not sent", number)
	}
	delete(r.pending, number)
	if r.phase == phaseDone {
		return nil // too late: the result is out
	}
	r.rtts = append(r.rtts, at.Sub(sent).Nanoseconds())
	if len(r.rtts) == r.requests {
		close(r.allIn)
	}
	return nil
}

// finish ends the run and returns the result's fields from the replies and
// errors; the caller adds the push rates.
func (r *runState) finish(secs float64) map[string]any {
	r.mu.Lock()
	r.phase = phaseDone
	rtts := slices.Clone(r.rtts)
	errCount, firstError := r.errors, r.firstError
	r.mu.Unlock()

	slices.Sort(rtts)
	n := len(rtts)
	us := func(ns int64) jsonFloat { return jsonFloat(float64(ns) / 1000) }
	// Nearest rank: the value at index ceil(q*n)-1 of the sorted samples
	// (the small epsilon keeps e.g. 0.999*1000 from rounding up to 1000).
	at := func(q float64) jsonFloat {
		if n == 0 {
			return 0
		}
		i := int(math.Ceil(q*float64(n)-1e-9)) - 1
		return us(rtts[min(max(i, 0), n-1)])
	}
	var sum float64
	for _, v := range rtts {
		sum += float64(v)
	}
	avg, maxRTT := jsonFloat(0), jsonFloat(0)
	if n > 0 {
		avg = jsonFloat(sum / float64(n) / 1000)
		maxRTT = us(rtts[n-1])
	}
	return map[string]any{
		"completed":   n,
		"per_sec":     jsonFloat(float64(n) / secs),
		"secs":        jsonFloat(secs),
		"avg_us":      avg,
		"p50_us":      at(0.50),
		"p99_us":      at(0.99),
		"p999_us":     at(0.999),
		"max_us":      maxRTT,
		"errors":      errCount,
		"first_error": firstError, // nil prints null
		"mode":        "stream",
		"conns":       1,
		"requests":    r.requests,
		"missing":     max(r.requests-n, 0),
		"client":      clientName,
	}
}

// emit writes v as one JSON line to stdout (unbuffered: the runner sees it
// at once). Keys come out sorted, as serde_json prints a map.
func emit(v map[string]any) {
	var line bytes.Buffer
	enc := json.NewEncoder(&line)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // adds the newline
		fail("encoding the result: %v", err)
	}
	os.Stdout.Write(line.Bytes())
}

// jsonFloat is a float64 that always prints as a JSON float ("5.0", not
// "5"), as serde_json prints an f64, and as null if it is not finite.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	b, err := json.Marshal(v)
	if err == nil && !bytes.ContainsAny(b, ".eE") {
		b = append(b, ".0"...)
	}
	return b, err
}

// quoteShort quotes the start of an unexpected reply for an error message.
func quoteShort(p []byte) string {
	const limit = 40
	if len(p) > limit {
		return strconv.Quote(string(p[:limit])) + "..."
	}
	return strconv.Quote(string(p))
}
