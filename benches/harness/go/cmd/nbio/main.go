// Command nbio is the github.com/lesismal/nbio baseline: an nbhttp.Engine in
// non-blocking IO mode (epoll poller goroutines, no goroutine per connection)
// with nbio's websocket Upgrader on any path.
package main

import (
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/lesismal/nbio/logging"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"

	"rapidws-bench/go/internal/harness"
)

func main() {
	cfg := harness.Parse()
	// nbio logs engine start-up and connection errors at Info/Error level;
	// silence it so nothing is printed per connection.
	logging.SetLevel(logging.LevelNone)

	// Upgrader defaults: no compression, MessageLengthLimit 4 MiB, pings
	// answered with pongs, close frames echoed, KeepaliveTime 120 s, outgoing
	// messages fragmented into 32 KiB frames (engine default).
	up := websocket.NewUpgrader()
	up.CheckOrigin = func(*http.Request) bool { return true }
	up.OnOpen(func(c *websocket.Conn) {
		if !cfg.Pushing() {
			return
		}
		stop := make(chan struct{})
		c.SetSession(stop)
		// Conn.WriteMessage holds the connection's mutex: safe with the echo.
		go cfg.PushLoop(stop, func(p []byte) error { return c.WriteMessage(websocket.BinaryMessage, p) })
	})
	up.OnMessage(func(c *websocket.Conn, mt websocket.MessageType, data []byte) {
		_ = c.WriteMessage(mt, data)
	})
	up.OnClose(func(c *websocket.Conn, _ error) {
		if stop, ok := c.Session().(chan struct{}); ok {
			close(stop)
		}
	})

	engine := nbhttp.NewEngine(nbhttp.Config{
		Network: "tcp",
		Addrs:   []string{cfg.Addr},
		IOMod:   nbhttp.IOModNonBlocking,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = up.Upgrade(w, r, nil) // writes the HTTP error itself
		}),
	})
	if err := engine.Start(); err != nil {
		harness.Fatal("nbio", err)
	}
	cfg.Started("nbio")

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	engine.Stop()
}
