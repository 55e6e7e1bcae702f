// Command sdkpeer drives Centrifugo's Go SDK (centrifuge-go) against a
// server of Centrifugo's client protocol v2 and prints one JSON object:
// what the SDK saw. tests/centrifuge_go.rs starts the server (and a cut
// proxy) and asserts on the object.
//
//	sdkpeer -scenario S -url ws://HOST/connection/websocket -format json|protobuf [-api http://HOST/api/ -key K] [-control http://PROXY] [-secret S] [-count N] [-cuts N]
//
// The scenarios:
//
//   - basic: subscribe, publications through the server HTTP API with
//     their offsets, the channel's history through the SDK, RPC (`echo`
//     and a method the server does not know).
//   - cut: a numbered sequence published while the proxy cuts the SDK's
//     connection again and again; each resubscribe recovers.
//   - gap: the proxy holds the SDK away while more is published than the
//     history keeps; the resubscribe says so, and live publications
//     follow.
//   - tokens: connection tokens refreshed through GetToken, presence and
//     presence stats of two users, refused tokens.
//
// A wait that times out prints what was seen so far, with "failure", and
// exits 1. With SDKPEER_TRACE set, the SDK's trace (every frame) and the
// cuts go to stderr.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/centrifugal/centrifuge-go"
)

var (
	scenario = flag.String("scenario", "basic", "basic, cut, gap or tokens")
	wsURL    = flag.String("url", "", "ws://HOST/connection/websocket (the server's, or the proxy's)")
	format   = flag.String("format", "json", "json or protobuf")
	apiURL   = flag.String("api", "", "the server HTTP API, http://HOST/api/")
	apiKey   = flag.String("key", "", "the server HTTP API's key")
	control  = flag.String("control", "", "the cut proxy's control endpoint, http://HOST")
	secret   = flag.String("secret", "", "the HS256 secret of connection tokens (tokens)")
	count    = flag.Int("count", 20, "publications (basic; at least this many for cut; the overflow for gap)")
	cuts     = flag.Int("cuts", 25, "connections to cut (cut)")
)

// report is what is printed, at the end or on a failure.
var (
	reportMu sync.Mutex
	report   = map[string]any{}
)

func put(key string, value any) {
	reportMu.Lock()
	defer reportMu.Unlock()
	report[key] = value
}

func printReport() {
	reportMu.Lock()
	defer reportMu.Unlock()
	// A peer still in use is put as its snapshot function: taken now.
	for key, value := range report {
		if snapshot, ok := value.(func() map[string]any); ok {
			report[key] = snapshot()
		}
	}
	out, err := json.Marshal(report)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
}

// fail prints what was seen with why it stopped, and exits 1.
func fail(format string, args ...any) {
	put("failure", fmt.Sprintf(format, args...))
	printReport()
	os.Exit(1)
}

// until waits for cond (checked every 5 ms), or fails after timeout.
func until(what string, timeout time.Duration, cond func() bool) {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			fail("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type subscribed struct {
	WasRecovering bool   `json:"wasRecovering"`
	Recovered     bool   `json:"recovered"`
	Recoverable   bool   `json:"recoverable"`
	Positioned    bool   `json:"positioned"`
	Offset        uint64 `json:"offset"`
	Epoch         string `json:"epoch"`
}

type publication struct {
	Data   string `json:"data"`
	Offset uint64 `json:"offset"`
}

// peer is one SDK client with (at most) one subscription, and what they
// saw.
type peer struct {
	client *centrifuge.Client
	sub    *centrifuge.Subscription

	mu           sync.Mutex
	clientID     string
	states       []string
	errors       []string
	connected    int
	subscribed   []subscribed
	publications []publication
	tokens       int
	// Called on each connected event, in the SDK's callback queue.
	onConnected func()
}

// newPeer makes a client with cfg (reconnecting within 10–100 ms unless
// cfg says otherwise) and, unless channel is empty, a subscription to
// channel. getToken, if given, is the client's GetToken (counted).
func newPeer(cfg centrifuge.Config, channel string, getToken func() string) *peer {
	p := &peer{}
	if cfg.MinReconnectDelay == 0 {
		cfg.MinReconnectDelay = 10 * time.Millisecond
	}
	if cfg.MaxReconnectDelay == 0 {
		cfg.MaxReconnectDelay = 100 * time.Millisecond
	}
	if os.Getenv("SDKPEER_TRACE") != "" {
		// Every frame in and out, on stderr (shown when the test fails).
		cfg.LogLevel = centrifuge.LogLevelTrace
		cfg.LogHandler = func(e centrifuge.LogEntry) {
			fmt.Fprintf(os.Stderr, "%s %s %v\n", time.Now().Format("15:04:05.000000"), e.Message, e.Fields)
		}
	}
	if getToken != nil {
		cfg.GetToken = func(centrifuge.ConnectionTokenEvent) (string, error) {
			p.mu.Lock()
			p.tokens++
			p.mu.Unlock()
			return getToken(), nil
		}
	}
	if *format == "protobuf" {
		p.client = centrifuge.NewProtobufClient(*wsURL, cfg)
	} else {
		p.client = centrifuge.NewJsonClient(*wsURL, cfg)
	}
	p.client.OnConnecting(func(e centrifuge.ConnectingEvent) {
		p.record(fmt.Sprintf("connecting %d", e.Code))
	})
	p.client.OnConnected(func(e centrifuge.ConnectedEvent) {
		p.mu.Lock()
		p.clientID = e.ClientID
		p.connected++
		p.states = append(p.states, "connected")
		p.mu.Unlock()
		if p.onConnected != nil {
			p.onConnected()
		}
	})
	p.client.OnDisconnected(func(e centrifuge.DisconnectedEvent) {
		p.record(fmt.Sprintf("disconnected %d %s", e.Code, e.Reason))
	})
	p.client.OnError(func(e centrifuge.ErrorEvent) {
		p.mu.Lock()
		p.errors = append(p.errors, e.Error.Error())
		p.mu.Unlock()
	})
	if channel == "" {
		return p
	}
	sub, err := p.client.NewSubscription(channel)
	if err != nil {
		fail("new subscription: %v", err)
	}
	p.sub = sub
	sub.OnSubscribed(func(e centrifuge.SubscribedEvent) {
		s := subscribed{
			WasRecovering: e.WasRecovering,
			Recovered:     e.Recovered,
			Recoverable:   e.Recoverable,
			Positioned:    e.Positioned,
		}
		if e.StreamPosition != nil {
			s.Offset = e.StreamPosition.Offset
			s.Epoch = e.StreamPosition.Epoch
		}
		p.mu.Lock()
		p.subscribed = append(p.subscribed, s)
		p.mu.Unlock()
	})
	sub.OnPublication(func(e centrifuge.PublicationEvent) {
		p.mu.Lock()
		p.publications = append(p.publications, publication{Data: string(e.Data), Offset: e.Offset})
		p.mu.Unlock()
	})
	sub.OnError(func(e centrifuge.SubscriptionErrorEvent) {
		p.mu.Lock()
		p.errors = append(p.errors, "sub: "+e.Error.Error())
		p.mu.Unlock()
	})
	if err := sub.Subscribe(); err != nil {
		fail("subscribe: %v", err)
	}
	return p
}

func (p *peer) record(state string) {
	p.mu.Lock()
	p.states = append(p.states, state)
	p.mu.Unlock()
}

func (p *peer) connect() {
	if err := p.client.Connect(); err != nil {
		fail("connect: %v", err)
	}
}

// counts: connected events, subscribed events, publications.
func (p *peer) counts() (int, int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connected, len(p.subscribed), len(p.publications)
}

func (p *peer) snapshot() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return map[string]any{
		"client":       p.clientID,
		"states":       append([]string{}, p.states...),
		"errors":       append([]string{}, p.errors...),
		"subscribed":   append([]subscribed{}, p.subscribed...),
		"publications": append([]publication{}, p.publications...),
		"tokens":       p.tokens,
		"final":        string(p.client.State()),
	}
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// post sends body (JSON) to url with the API key; the answer's status and
// body.
func post(url string, body any) (int, []byte) {
	encoded, err := json.Marshal(body)
	if err != nil {
		fail("encode: %v", err)
	}
	request, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(encoded))
	if err != nil {
		fail("request: %v", err)
	}
	request.Header.Set("X-API-Key", *apiKey)
	request.Header.Set("Content-Type", "application/json")
	response, err := httpClient.Do(request)
	if err != nil {
		fail("POST %s: %v", url, err)
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(response.Body)
	if err != nil {
		fail("POST %s: %v", url, err)
	}
	return response.StatusCode, answer
}

type position struct {
	Offset uint64 `json:"offset"`
	Epoch  string `json:"epoch"`
}

// publish publishes {"n":n} to channel through the server HTTP API; the
// position its answer gives.
func publish(channel string, n int) position {
	status, body := post(*apiURL+"publish", map[string]any{"channel": channel, "data": map[string]int{"n": n}})
	var answer struct {
		Result *position `json:"result"`
	}
	if err := json.Unmarshal(body, &answer); status != http.StatusOK || err != nil || answer.Result == nil {
		fail("publish %d: %d %s", n, status, body)
	}
	return *answer.Result
}

// proxy asks the cut proxy to cut, hold or release; how many connections
// it cut.
func proxy(action string) int {
	status, body := post(*control+"/"+action, map[string]any{})
	var answer struct {
		Cut int `json:"cut"`
	}
	if err := json.Unmarshal(body, &answer); status != http.StatusOK || err != nil {
		fail("proxy %s: %d %s", action, status, body)
	}
	return answer.Cut
}

func errorValue(err error) any {
	var e *centrifuge.Error
	if errors.As(err, &e) {
		return map[string]any{"code": e.Code, "message": e.Message, "temporary": e.Temporary}
	}
	return err.Error()
}

func timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func basic() {
	p := newPeer(centrifuge.Config{}, "news", nil)
	put("peer", p.snapshot)
	p.connect()
	until("subscribed", 10*time.Second, func() bool { _, s, _ := p.counts(); return s == 1 })
	var answers []position
	for n := 1; n <= *count; n++ {
		answers = append(answers, publish("news", n))
	}
	put("apiAnswers", answers)
	until("every publication", 10*time.Second, func() bool { _, _, n := p.counts(); return n == *count })

	ctx, cancel := timeout()
	defer cancel()
	history, err := p.sub.History(ctx, centrifuge.WithHistoryLimit(-1))
	if err != nil {
		put("history", map[string]any{"error": errorValue(err)})
	} else {
		kept := []publication{}
		for _, pub := range history.Publications {
			kept = append(kept, publication{Data: string(pub.Data), Offset: pub.Offset})
		}
		put("history", map[string]any{"publications": kept, "offset": history.Offset, "epoch": history.Epoch})
	}

	// JSON in both formats: the JSON format carries data as JSON.
	payload := []byte(`{"echo":[1,"two",{"three":3.5}],"empty":{}}`)
	put("sent", string(payload))
	echoed, err := p.client.RPC(ctx, "echo", payload)
	if err != nil {
		put("echo", map[string]any{"error": errorValue(err)})
	} else {
		put("echo", map[string]any{"data": string(echoed.Data)})
	}
	_, err = p.client.RPC(ctx, "no-such-method", payload)
	if err != nil {
		put("unknown", map[string]any{"error": errorValue(err)})
	} else {
		put("unknown", map[string]any{"error": nil})
	}
	p.client.Close()
	put("peer", p.snapshot())
}

// cutScenario publishes 1, 2, 3... (at least -count, and on until the
// cuts are done) while the proxy cuts the SDK's connection -cuts times:
// each a moment after it resubscribed, every fourth also again from the
// SDK's connected event that follows (its resubscribe on the way).
func cutScenario() {
	p := newPeer(centrifuge.Config{}, "sequence", nil)
	put("peer", p.snapshot)
	p.connect()
	until("subscribed", 10*time.Second, func() bool { _, s, _ := p.counts(); return s == 1 })

	var cutsDone atomic.Bool
	var published atomic.Int64
	var answersMu sync.Mutex
	var offsets []uint64
	epochs := map[string]bool{}
	publishing := make(chan struct{})
	go func() {
		defer close(publishing)
		for n := 1; n <= *count || !cutsDone.Load(); n++ {
			answer := publish("sequence", n)
			answersMu.Lock()
			offsets = append(offsets, answer.Offset)
			epochs[answer.Epoch] = true
			answersMu.Unlock()
			published.Store(int64(n))
			time.Sleep(2 * time.Millisecond)
		}
	}()

	var cutMu sync.Mutex
	var cut []int
	effective := 0
	take := func() {
		if os.Getenv("SDKPEER_TRACE") != "" {
			fmt.Fprintf(os.Stderr, "%s cut\n", time.Now().Format("15:04:05.000000"))
		}
		n := proxy("cut")
		cutMu.Lock()
		defer cutMu.Unlock()
		cut = append(cut, n)
		if n > 0 {
			effective++
		}
	}
	landed := func() int {
		cutMu.Lock()
		defer cutMu.Unlock()
		return effective
	}
	// Armed, the next connected event cuts: the SDK has its resubscribe
	// on the way, or its answer.
	var armed atomic.Bool
	p.onConnected = func() {
		if armed.CompareAndSwap(true, false) {
			take()
		}
	}
	// Publications answered between a cut and the resubscribe after it:
	// published while the SDK was away (or on its way back).
	var away []int64
	// Cuts land on a connected client: the SDK (v0.12.1) does not notice
	// a transport lost while its connect command is unanswered until that
	// command times out (5 s).
	subscribed := func() bool {
		return p.client.State() == centrifuge.StateConnected && p.sub.State() == centrifuge.SubStateSubscribed
	}
	for round := 0; landed() < *cuts; round++ {
		if round > 4**cuts {
			fail("the cuts did not take")
		}
		until("subscribed", 10*time.Second, subscribed)
		_, resubscribed, _ := p.counts()
		time.Sleep(time.Duration(rand.Intn(30)) * time.Millisecond)
		if !subscribed() {
			continue
		}
		armed.Store(round%4 == 3)
		take()
		before := published.Load()
		until("the cut on reconnecting", 10*time.Second, func() bool { return !armed.Load() })
		until("a resubscribe", 10*time.Second, func() bool { _, s, _ := p.counts(); return s > resubscribed })
		away = append(away, published.Load()-before)
	}
	cutsDone.Store(true)
	<-publishing
	total := int(published.Load())
	until("every publication", 20*time.Second, func() bool { _, _, n := p.counts(); return n >= total })
	// Anything delivered twice would be on its way by now.
	time.Sleep(300 * time.Millisecond)
	p.client.Close()
	answersMu.Lock()
	epochList := []string{}
	for epoch := range epochs {
		epochList = append(epochList, epoch)
	}
	put("published", total)
	put("apiOffsets", offsets)
	put("apiEpochs", epochList)
	answersMu.Unlock()
	put("cuts", cut)
	put("away", away)
	put("peer", p.snapshot())
}

// gap: 1..3 live; held away while 4..3+count are published; released, then
// 4+count.. 6+count live.
func gap() {
	p := newPeer(centrifuge.Config{}, "gap", nil)
	put("peer", p.snapshot)
	p.connect()
	until("subscribed", 10*time.Second, func() bool { _, s, _ := p.counts(); return s == 1 })
	for n := 1; n <= 3; n++ {
		publish("gap", n)
	}
	until("1..3", 10*time.Second, func() bool { _, _, n := p.counts(); return n == 3 })
	put("held", proxy("hold"))
	until("reconnecting", 10*time.Second, func() bool { return p.client.State() == centrifuge.StateConnecting })
	for n := 4; n < 4+*count; n++ {
		publish("gap", n)
	}
	proxy("release")
	until("a resubscribe", 10*time.Second, func() bool { _, s, _ := p.counts(); return s == 2 })
	for n := 4 + *count; n < 7+*count; n++ {
		publish("gap", n)
	}
	until("the live publications", 10*time.Second, func() bool { _, _, n := p.counts(); return n == 6 })
	p.client.Close()
	put("peer", p.snapshot())
}

// jwt is an HS256 token of claims, signed with key.
func jwt(claims map[string]any, key string) string {
	encode := func(value any) string {
		raw, err := json.Marshal(value)
		if err != nil {
			fail("encode: %v", err)
		}
		return base64.RawURLEncoding.EncodeToString(raw)
	}
	signed := encode(map[string]string{"alg": "HS256", "typ": "JWT"}) + "." + encode(claims)
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func token(user string, ttl time.Duration) string {
	return jwt(map[string]any{"sub": user, "exp": time.Now().Add(ttl).Unix()}, *secret)
}

type member struct {
	Client string `json:"client"`
	User   string `json:"user"`
}

func presence(p *peer) map[string]any {
	ctx, cancel := timeout()
	defer cancel()
	result := map[string]any{}
	list, err := p.sub.Presence(ctx)
	if err != nil {
		result["error"] = errorValue(err)
		return result
	}
	members := []member{}
	for id, info := range list.Clients {
		if id != info.Client {
			fail("presence: %s listed as %s", info.Client, id)
		}
		members = append(members, member{Client: info.Client, User: info.User})
	}
	sort.Slice(members, func(i, j int) bool { return members[i].User < members[j].User })
	result["clients"] = members
	stats, err := p.sub.PresenceStats(ctx)
	if err != nil {
		result["statsError"] = errorValue(err)
	} else {
		result["stats"] = map[string]any{"clients": stats.NumClients, "users": stats.NumUsers}
	}
	return result
}

// tokens: alice (2 s tokens, refreshed through GetToken) and bob in one
// channel, listed by presence; after 5 s alice is still connected; then
// bob leaves. An expired token refreshed at connect; a forged one and
// none at all refused.
func tokens() {
	alice := newPeer(centrifuge.Config{Token: token("alice", 2*time.Second)}, "room", func() string {
		return token("alice", 2*time.Second)
	})
	bob := newPeer(centrifuge.Config{Token: token("bob", time.Minute)}, "room", nil)
	start := time.Now()
	alice.connect()
	bob.connect()
	until("both subscribed", 10*time.Second, func() bool {
		_, a, _ := alice.counts()
		_, b, _ := bob.counts()
		return a == 1 && b == 1
	})
	put("presence", presence(alice))
	time.Sleep(time.Until(start.Add(5 * time.Second)))
	put("alice", alice.snapshot())
	bob.client.Close()
	put("bob", bob.snapshot())
	until("bob's leave", 10*time.Second, func() bool {
		clients, _ := presence(alice)["clients"].([]member)
		return len(clients) == 1
	})
	put("presenceAfter", presence(alice))
	alice.client.Close()

	expired := newPeer(centrifuge.Config{Token: token("carol", -10*time.Second)}, "", func() string {
		return token("carol", time.Minute)
	})
	expired.connect()
	until("the expired token's client connects", 10*time.Second, func() bool { c, _, _ := expired.counts(); return c == 1 })
	expired.client.Close()
	put("expired", expired.snapshot())

	refused := func(name string, cfg centrifuge.Config) {
		p := newPeer(cfg, "", nil)
		p.connect()
		until(name+" refused", 10*time.Second, func() bool { return p.client.State() == centrifuge.StateDisconnected })
		p.client.Close()
		put(name, p.snapshot())
	}
	refused("forged", centrifuge.Config{Token: jwt(map[string]any{"sub": "eve"}, "guess")})
	refused("anonymous", centrifuge.Config{})
}

func main() {
	flag.Parse()
	put("scenario", *scenario)
	put("format", *format)
	switch *scenario {
	case "basic":
		basic()
	case "cut":
		cutScenario()
	case "gap":
		gap()
	case "tokens":
		tokens()
	default:
		fail("unknown scenario %q", *scenario)
	}
	printReport()
}
