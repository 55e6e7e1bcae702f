// Command quickws is the github.com/antlabs/quickws baseline: a net/http
// server that calls quickws.Upgrade with callbacks on any path.
package main

import (
	"net"
	"net/http"
	"sync"

	"github.com/antlabs/quickws"

	"rapidws-bench/go/internal/harness"
)

// options are the upgrade options: ping replies and the callbacks, plus
// permessage-deflate with -deflate. WithServerDecompressAndCompress turns on
// both directions (decompression alone only inflates what the client sends).
// The rest is quickws's (antlabs/wsutil's) fixed behaviour, which matches
// rapidws's echo --deflate except for the threshold:
//   - no context takeover on either side (the default without
//     WithServerContextTakeover), so no compressor is held per connection;
//   - level 1 (wsutil's DefaultCompressionLevel, not configurable);
//   - window 15 unless the client asks for less;
//   - no threshold option: every data message is compressed, however short.
//
// quickws accepts an offer only if it carries a parameter (a bare
// "permessage-deflate" is ignored); the load generator's offer has
// client_no_context_takeover.
func options(cfg *harness.Config, open quickws.OnOpenFunc, msg quickws.OnMessageFunc, closed quickws.OnCloseFunc) []quickws.ServerOption {
	opts := []quickws.ServerOption{
		quickws.WithServerReplyPing(),
		quickws.WithServerCallbackFunc(open, msg, closed),
	}
	if cfg.Deflate {
		opts = append(opts, quickws.WithServerDecompressAndCompress())
	}
	return opts
}

func main() {
	cfg := harness.Parse()

	handler := func(w http.ResponseWriter, r *http.Request) {
		stop := make(chan struct{})
		var once sync.Once
		stopPush := func() { once.Do(func() { close(stop) }) }

		onOpen := func(c *quickws.Conn) {
			// Conn.WriteMessage builds the whole frame and hands it to a single
			// net.Conn.Write, which Go serialises per connection; the library's
			// own pong/close replies go the same way, so no extra mutex needed.
			go cfg.PushLoop(stop, func(p []byte) error { return c.WriteMessage(quickws.Binary, p) })
		}
		onMessage := func(c *quickws.Conn, op quickws.Opcode, msg []byte) {
			// With WithServerReplyPing the pong is already sent when OnMessage
			// sees the ping; only data messages are echoed.
			if op == quickws.Text || op == quickws.Binary {
				_ = c.WriteMessage(op, msg)
			}
		}
		onClose := func(*quickws.Conn, error) { stopPush() }

		// quickws echoes whatever Sec-WebSocket-Protocol the client offers
		// when the server lists none; drop the header so no subprotocol is
		// ever negotiated, as with the other servers.
		r.Header.Del("Sec-WebSocket-Protocol")
		// quickws does not answer pings unless asked: WithServerReplyPing.
		// Defaults otherwise: no compression, no read limit, no UTF-8 check.
		c, err := quickws.Upgrade(w, r, options(cfg, onOpen, onMessage, onClose)...)
		if err != nil {
			return
		}
		_ = c.ReadLoop() // blocks until the connection is done, then closes it
		stopPush()
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		harness.Fatal("quickws", err)
	}
	cfg.Started("quickws")
	harness.Fatal("quickws", http.Serve(ln, http.HandlerFunc(handler)))
}
