// Command gorilla is the github.com/gorilla/websocket baseline: a net/http
// server that upgrades on any path and echoes every message.
package main

import (
	"bytes"
	"compress/flate"
	"net"
	"net/http"
	"sync"

	"github.com/gorilla/websocket"

	"rapidws-bench/go/internal/harness"
)

func main() {
	cfg := harness.Parse()
	// Library defaults: no compression, no read limit (0 = unlimited), default
	// ping handler answers with a pong, default close handler echoes the close.
	// Only the origin check is opened up so any client may connect, and with
	// -deflate, permessage-deflate is negotiated (see compress).
	up := websocket.Upgrader{
		CheckOrigin:       func(*http.Request) bool { return true },
		EnableCompression: cfg.Deflate,
	}

	handler := func(w http.ResponseWriter, r *http.Request) {
		conn, err := up.Upgrade(w, r, nil) // writes the HTTP error itself
		if err != nil {
			return
		}
		defer conn.Close()
		if cfg.Deflate {
			compress(conn)
		}

		// gorilla allows one concurrent writer (WriteControl excepted), so the
		// echo path and the push goroutine share mu. closed stops pushes once
		// the close reply is being sent.
		var mu sync.Mutex
		closed := false
		send := func(op int, p []byte) error {
			mu.Lock()
			defer mu.Unlock()
			if closed {
				return websocket.ErrCloseSent
			}
			return conn.WriteMessage(op, p)
		}
		replyClose := conn.CloseHandler()
		conn.SetCloseHandler(func(code int, text string) error {
			mu.Lock()
			closed = true
			mu.Unlock()
			return replyClose(code, text)
		})

		stop := make(chan struct{})
		defer close(stop)
		go cfg.PushLoop(stop, func(p []byte) error { return send(websocket.BinaryMessage, p) })

		var buf bytes.Buffer // reused per connection: no allocation per message
		for {
			op, rd, err := conn.NextReader()
			if err != nil {
				return
			}
			buf.Reset()
			if _, err := buf.ReadFrom(rd); err != nil {
				return
			}
			if err := send(op, buf.Bytes()); err != nil {
				return
			}
		}
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		harness.Fatal("gorilla", err)
	}
	cfg.Started("gorilla")
	harness.Fatal("gorilla", http.Serve(ln, http.HandlerFunc(handler)))
}

// compress sets write compression on a connection upgraded with
// EnableCompression; both calls are no-ops if the client did not offer
// permessage-deflate. gorilla only does no context takeover on either side
// (window 15, a pooled compressor per message) and has no threshold: every
// data message is compressed. Write compression and level 1 are gorilla's
// defaults as well, set here so the settings do not depend on them.
func compress(conn *websocket.Conn) {
	conn.EnableWriteCompression(true)
	_ = conn.SetCompressionLevel(flate.BestSpeed) // a valid level: never fails
}
