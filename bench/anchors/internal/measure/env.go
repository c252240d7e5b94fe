package measure

import (
	"net/http"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
)

// Environment is the Go runtime's own account of what the harness pinned: the Go version,
// GOMAXPROCS and GOGC in effect (read back from the runtime, not from the environment), for
// the result line, so the table prints what ran rather than what was asked for.
func Environment() map[string]any {
	gogc := debug.SetGCPercent(100)
	debug.SetGCPercent(gogc)
	return map[string]any{
		"go_version": runtime.Version(),
		"gomaxprocs": runtime.GOMAXPROCS(0),
		"gogc":       gogc,
	}
}

// ContentTypes records the Content-Type of every response a client received, so a consumer
// reports the encoding the server actually sent it (its `wire`), not the one it asked for.
type ContentTypes struct {
	mu   sync.Mutex
	seen map[string]bool
}

// Wrap is a rest.Config.WrapTransport.
func (c *ContentTypes) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && strings.Contains(req.URL.Path, "/configmaps") {
			c.mu.Lock()
			if c.seen == nil {
				c.seen = map[string]bool{}
			}
			c.seen[resp.Header.Get("Content-Type")] = true
			c.mu.Unlock()
		}
		return resp, err
	})
}

// Seen lists the Content-Types of the ConfigMap list and watch responses, sorted.
func (c *ContentTypes) Seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.seen))
	for t := range c.seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
