// Command gws is the github.com/lxzan/gws baseline: gws's own server
// (gws.NewServer on a net.Listener, any path) with default ServerOption.
package main

import (
	"net"
	"time"

	"github.com/lxzan/gws"

	"rapidws-bench/go/internal/harness"
)

const stopKey = "push-stop"

// echo embeds BuiltinEventHandler, whose OnPing answers with a pong. gws
// answers close frames itself. Default ServerOption: no compression,
// ReadMaxPayloadSize 16 MiB, single-goroutine (non-parallel) reads.
type echo struct {
	gws.BuiltinEventHandler
	cfg *harness.Config
}

func (e *echo) OnOpen(c *gws.Conn) {
	if !e.cfg.Pushing() {
		return
	}
	stop := make(chan struct{})
	c.Session().Store(stopKey, stop)
	// Conn.WriteMessage takes the connection's write mutex: safe with the echo.
	go e.cfg.PushLoop(stop, func(p []byte) error { return c.WriteMessage(gws.OpcodeBinary, p) })
}

func (e *echo) OnClose(c *gws.Conn, _ error) {
	if v, ok := c.Session().Load(stopKey); ok {
		close(v.(chan struct{}))
	}
}

func (e *echo) OnMessage(c *gws.Conn, m *gws.Message) {
	defer m.Close()
	_ = c.WriteMessage(m.Opcode, m.Bytes())
}

func main() {
	cfg := harness.Parse()
	srv := gws.NewServer(&echo{cfg: cfg}, &gws.ServerOption{})
	// The default OnError logs every failed request and, when the request
	// cannot even be read (e.g. the harness's connect-and-close readiness
	// probe), leaves the socket open. Close it quietly instead; a nil conn is
	// an Accept error, after which RunListener retries at once, so back off.
	srv.OnError = func(conn net.Conn, _ error) {
		if conn == nil {
			time.Sleep(5 * time.Millisecond)
			return
		}
		_ = conn.Close()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		harness.Fatal("gws", err)
	}
	cfg.Started("gws")
	harness.Fatal("gws", srv.RunListener(ln))
}
