// Command nbio is the github.com/lesismal/nbio baseline: an nbhttp.Engine in
// non-blocking IO mode (harness.ServeNbio) with nbio's websocket Upgrader on
// any path.
package main

import (
	"net/http"

	"github.com/lesismal/nbio/nbhttp/websocket"

	"rapidws-bench/go/internal/harness"
)

func main() {
	cfg := harness.Parse()
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

	cfg.ServeNbio("nbio", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = up.Upgrade(w, r, nil) // writes the HTTP error itself
	}))
}
