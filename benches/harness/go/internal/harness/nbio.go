package harness

import (
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/lesismal/nbio/logging"
	"github.com/lesismal/nbio/nbhttp"
)

// ServeNbio runs handler on an nbhttp.Engine in non-blocking IO mode (epoll
// poller goroutines, no goroutine per connection) on -addr until SIGINT or
// SIGTERM. nbio's own logging is off, so nothing is printed per connection.
func (c *Config) ServeNbio(name string, handler http.Handler) {
	logging.SetLevel(logging.LevelNone)
	engine := nbhttp.NewEngine(nbhttp.Config{
		Network: "tcp",
		Addrs:   []string{c.Addr},
		IOMod:   nbhttp.IOModNonBlocking,
		Handler: handler,
	})
	if err := engine.Start(); err != nil {
		Fatal(name, err)
	}
	c.Started(name)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	engine.Stop()
}
