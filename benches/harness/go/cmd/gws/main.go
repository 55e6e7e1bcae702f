// Command gws is the github.com/lxzan/gws baseline: gws's own server
// (gws.NewServer on a net.Listener, any path) with default ServerOption,
// plus permessage-deflate with -deflate, and wss (crypto/tls) with -tls-cert
// and -tls-key.
package main

import (
	"compress/flate"

	"github.com/lxzan/gws"

	"rapidws-bench/go/internal/harness"
)

const stopKey = "push-stop"

// echo embeds BuiltinEventHandler, whose OnPing answers with a pong. gws
// answers close frames itself. Default ServerOption: no compression,
// ReadMaxPayloadSize 16 MiB, single-goroutine (non-parallel) reads; see
// serverOption for what -deflate changes.
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

// serverOption is the default ServerOption, with permessage-deflate on when
// -deflate is given, set like rapidws's echo --deflate where gws allows it:
//   - no context takeover on either side, so the compressors are shared from
//     gws's pool (default PoolSize 32) instead of held per connection;
//   - level 1 (flate.BestSpeed; gws uses klauspost/compress/flate, whose
//     levels have the same values as the standard library's);
//   - window bits 15 both ways (what gws picks without context takeover,
//     written out so the answer to the offer does not depend on it);
//   - Threshold 1, the lowest gws allows (0 means its default of 512): every
//     non-empty data message is compressed. rapidws sends messages under 64
//     bytes uncompressed; at the benchmark's 1 KiB both compress all of them.
func serverOption(cfg *harness.Config) *gws.ServerOption {
	opt := &gws.ServerOption{}
	if cfg.Deflate {
		opt.PermessageDeflate = gws.PermessageDeflate{
			Enabled:               true,
			Level:                 flate.BestSpeed,
			Threshold:             1,
			ServerContextTakeover: false,
			ClientContextTakeover: false,
			ServerMaxWindowBits:   15,
			ClientMaxWindowBits:   15,
		}
	}
	return opt
}

func main() {
	cfg := harness.Parse()
	srv := gws.NewServer(&echo{cfg: cfg}, serverOption(cfg))
	srv.OnError = harness.QuietOnError
	// With -tls-cert and -tls-key: wss (the harness's wss peer).
	ln := cfg.Listen("gws")
	cfg.Started("gws")
	harness.Fatal("gws", srv.RunListener(ln))
}
