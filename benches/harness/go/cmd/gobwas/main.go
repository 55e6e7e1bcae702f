// Command gobwas is the github.com/gobwas/ws baseline: a plain net.Listener,
// one goroutine per connection, ws.Upgrade on the raw conn (any path) and a
// wsutil.Reader loop that echoes every message.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"rapidws-bench/go/internal/harness"
)

// conn serialises every write (echo, push, control replies) with mu.
type conn struct {
	mu     sync.Mutex
	nc     net.Conn
	bw     *bufio.Writer
	closed bool // a close reply was written: no more frames
}

func (c *conn) send(op ws.OpCode, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return wsutil.ClosedError{Code: ws.StatusNormalClosure}
	}
	if err := ws.WriteFrame(c.bw, ws.NewFrame(op, true, p)); err != nil {
		return err
	}
	return c.bw.Flush()
}

func serve(cfg *harness.Config, nc net.Conn) {
	defer nc.Close()
	if _, err := ws.Upgrade(nc); err != nil { // writes the HTTP error itself
		return
	}
	c := &conn{nc: nc, bw: bufio.NewWriter(nc)}
	stop := make(chan struct{})
	defer close(stop)
	go cfg.PushLoop(stop, func(p []byte) error { return c.send(ws.OpBinary, p) })

	// wsutil.ControlHandler answers pings and closes. Its reply is staged in
	// ctl and written under mu so it cannot interleave with a push.
	var ctl bytes.Buffer
	control := func(h ws.Header, r io.Reader) error {
		ctl.Reset()
		err := wsutil.ControlHandler{Src: r, Dst: &ctl, State: ws.StateServerSide, DisableSrcCiphering: true}.Handle(h)
		if ctl.Len() > 0 {
			c.mu.Lock()
			if !c.closed {
				if _, werr := nc.Write(ctl.Bytes()); err == nil {
					err = werr
				}
			}
			c.closed = c.closed || h.OpCode == ws.OpClose
			c.mu.Unlock()
		}
		return err
	}

	// DefaultReader: the library's default limits (none) and UTF-8 check.
	rd := wsutil.DefaultReader(bufio.NewReader(nc), ws.StateServerSide)
	rd.OnIntermediate = control
	var msg bytes.Buffer // reused per connection: no allocation per message
	for {
		h, err := rd.NextFrame()
		if err != nil {
			return
		}
		if h.OpCode.IsControl() {
			if err := control(h, rd); err != nil {
				return
			}
			continue
		}
		msg.Reset()
		if _, err := msg.ReadFrom(rd); err != nil {
			return
		}
		if err := c.send(h.OpCode, msg.Bytes()); err != nil {
			return
		}
	}
}

func main() {
	cfg := harness.Parse()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		harness.Fatal("gobwas", err)
	}
	cfg.Started("gobwas")
	for {
		nc, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			harness.Fatal("gobwas", err)
		}
		if err != nil { // e.g. EMFILE: back off instead of dying
			time.Sleep(5 * time.Millisecond)
			continue
		}
		go serve(cfg, nc)
	}
}
