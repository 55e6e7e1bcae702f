// Command gws-fanout is gws's pub/sub peer in the harness's fan-out
// protocol: `/?topics=a,b` subscribes (read in ServerOption.Authorize into
// the session), and a text message "<topic>\n<payload>" publishes
// <payload> to <topic> with gws's Broadcaster, which frames (and would
// compress) a message once for all its receivers. Topics are a map of
// connection sets behind a read-write lock, as gws's chat room example
// keeps its connections. Default ServerOption otherwise.
package main

import (
	"bytes"
	"net/http"
	"strings"
	"sync"

	"github.com/lxzan/gws"

	"rapidws-bench/go/internal/harness"
)

const topicsKey = "topics"

type hub struct {
	gws.BuiltinEventHandler
	mu     sync.RWMutex
	topics map[string]map[*gws.Conn]struct{}
}

func topicsOf(c *gws.Conn) []string {
	v, _ := c.Session().Load(topicsKey)
	topics, _ := v.([]string)
	return topics
}

func (h *hub) OnOpen(c *gws.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, topic := range topicsOf(c) {
		set := h.topics[topic]
		if set == nil {
			set = make(map[*gws.Conn]struct{})
			h.topics[topic] = set
		}
		set[c] = struct{}{}
	}
}

func (h *hub) OnClose(c *gws.Conn, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, topic := range topicsOf(c) {
		if set := h.topics[topic]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(h.topics, topic)
			}
		}
	}
}

func (h *hub) OnMessage(c *gws.Conn, m *gws.Message) {
	defer m.Close()
	if m.Opcode != gws.OpcodeText {
		return
	}
	text := m.Bytes()
	i := bytes.IndexByte(text, '\n')
	if i < 0 {
		return
	}
	topic := string(text[:i])
	// The message's buffer goes back to gws's pool on Close: the payload
	// outlives it in the connections' write queues.
	payload := append([]byte(nil), text[i+1:]...)
	b := gws.NewBroadcaster(gws.OpcodeText, payload)
	h.mu.RLock()
	for conn := range h.topics[topic] {
		_ = b.Broadcast(conn, nil)
	}
	h.mu.RUnlock()
	_ = b.Close()
}

func main() {
	cfg := harness.Parse()
	opt := &gws.ServerOption{
		Authorize: func(r *http.Request, session gws.SessionStorage) bool {
			var topics []string
			for _, topic := range strings.Split(r.URL.Query().Get("topics"), ",") {
				if topic != "" {
					topics = append(topics, topic)
				}
			}
			session.Store(topicsKey, topics)
			return true
		},
	}
	srv := gws.NewServer(&hub{topics: make(map[string]map[*gws.Conn]struct{})}, opt)
	srv.OnError = harness.QuietOnError
	ln := cfg.Listen("gws-fanout")
	cfg.Started("gws-fanout")
	harness.Fatal("gws-fanout", srv.RunListener(ln))
}
