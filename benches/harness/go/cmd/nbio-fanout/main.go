// Command nbio-fanout is nbio's peer in the harness's fan-out protocol: nbio
// has no pub/sub, so a publish is a loop over the topic's connections, as
// its chat examples broadcast. `/?topics=a,b` subscribes, and a text message
// "<topic>\n<payload>" is written to each connection of <topic> with
// Conn.WriteMessage (which frames it for each one). Topics are a map of
// connection sets behind a read-write lock. An nbhttp.Engine in
// non-blocking IO mode (harness.ServeNbio), Upgrader defaults otherwise.
package main

import (
	"bytes"
	"net/http"
	"strings"
	"sync"

	"github.com/lesismal/nbio/nbhttp/websocket"

	"rapidws-bench/go/internal/harness"
)

type hub struct {
	mu     sync.RWMutex
	topics map[string]map[*websocket.Conn]struct{}
}

func (h *hub) join(c *websocket.Conn, topics []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, topic := range topics {
		set := h.topics[topic]
		if set == nil {
			set = make(map[*websocket.Conn]struct{})
			h.topics[topic] = set
		}
		set[c] = struct{}{}
	}
}

func (h *hub) leave(c *websocket.Conn, topics []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, topic := range topics {
		if set := h.topics[topic]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(h.topics, topic)
			}
		}
	}
}

func (h *hub) publish(topic string, payload []byte) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for c := range h.topics[topic] {
		_ = c.WriteMessage(websocket.TextMessage, payload)
	}
}

func main() {
	cfg := harness.Parse()
	h := &hub{topics: make(map[string]map[*websocket.Conn]struct{})}

	up := websocket.NewUpgrader()
	up.CheckOrigin = func(*http.Request) bool { return true }
	up.OnMessage(func(_ *websocket.Conn, mt websocket.MessageType, data []byte) {
		if mt != websocket.TextMessage {
			return
		}
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return
		}
		// WriteMessage copies what it cannot write at once: data, valid
		// only in this callback, is not kept.
		h.publish(string(data[:i]), data[i+1:])
	})
	up.OnClose(func(c *websocket.Conn, _ error) {
		if topics, ok := c.Session().([]string); ok {
			h.leave(c, topics)
		}
	})

	cfg.ServeNbio("nbio-fanout", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var topics []string
		for _, topic := range strings.Split(r.URL.Query().Get("topics"), ",") {
			if topic != "" {
				topics = append(topics, topic)
			}
		}
		c, err := up.Upgrade(w, r, nil) // writes the HTTP error itself
		if err != nil {
			return
		}
		c.SetSession(topics)
		h.join(c, topics)
	}))
}
