package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
)

// setEnv replaces (or adds) the process's variable name.
func (p *proc) setEnv(name, value string) {
	for i, kv := range p.env {
		if strings.HasPrefix(kv, name+"=") {
			p.env[i] = name + "=" + value
			return
		}
	}
	p.env = append(p.env, name+"="+value)
}

// queryAt GETs path from addr without following redirects: the status, the
// decoded answer, and the Location header.
func queryAt(t *testing.T, addr, path string) (int, queryAnswer, string) {
	t.Helper()
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans queryAnswer
	if resp.StatusCode != http.StatusTemporaryRedirect {
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
			t.Fatalf("GET %s%s: %d, body not JSON: %v", addr, path, resp.StatusCode, err)
		}
	}
	return resp.StatusCode, ans, resp.Header.Get("Location")
}

// TestStateQueriesOverHTTP runs two processors of the aggregate job, one of
// them killed -9 and started again, and queries every key's aggregation on
// both: the owner answers 200 with the aggregation of the key's inputs; the
// other redirects to the owner's URL (SLUICE_QUERY_PEER_URL), once, and
// answers 421 naming the owner when asked after a redirect. Instance ids
// are loopback addresses (127.0.0.2, 127.0.0.3), so that the peer URL
// http://{instance}:port reaches each process.
func TestStateQueriesOverHTTP(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"127.0.0.2", "127.0.0.3"}
	for _, id := range ids {
		ln, err := net.Listen("tcp", net.JoinHostPort(id, "0"))
		if err != nil {
			t.Skipf("%s is not a loopback address here (Linux has all of 127/8): %v", id, err)
		}
		ln.Close()
	}
	var procs []*proc
	for _, id := range ids {
		p := newProc(t, brokers, id)
		p.metrics = net.JoinHostPort(id, port)
		p.setEnv("SLUICE_METRICS_ADDR", p.metrics)
		p.setEnv("SLUICE_QUERY_PEER_URL", "http://{instance}:"+port)
		p.start()
		procs = append(procs, p)
	}
	for _, p := range procs {
		p.awaitReady()
	}

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	inputs := map[string][]int64{}
	n := 0
	send := func(count int) {
		var recs []*kgo.Record
		for range count {
			n++
			key := "k" + strconv.Itoa(n%23)
			inputs[key] = append(inputs[key], int64(n))
			recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(strconv.Itoa(n))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	send(300)
	if err := procs[0].stop(syscall.SIGKILL); err == nil {
		t.Fatal("kill -9 reported a clean exit")
	}
	send(300)
	procs[0].start()
	send(300)
	procs[0].awaitReady()

	// Poll until every key reads its whole aggregation from its owner,
	// and the other instance sends it there.
	adm := kadm.NewClient(prod)
	deadline := time.Now().Add(time.Minute)
	pending := func() error {
		if sum, err := check.CommittedSum(context.Background(), adm, "e2e"); err != nil || sum != int64(n) {
			return fmt.Errorf("committed offsets add up to %d of %d (%v)", sum, n, err)
		}
		for key, vals := range inputs {
			agg := check.Running(vals)[len(vals)-1]
			path := "/state/aggregate?key=" + url.QueryEscape(key)
			var owner string
			for i, p := range procs {
				code, ans, loc := queryAt(t, p.metrics, path)
				switch code {
				case http.StatusOK:
					var got check.Aggregation
					if err := json.Unmarshal(ans.Value, &got); err != nil || got != agg {
						return fmt.Errorf("%s on %s: %s (%v), want %+v", key, ids[i], ans.Value, err, agg)
					}
					if ans.Partition == nil || ans.Instance != ids[i] || ans.Key == nil || *ans.Key != key {
						return fmt.Errorf("%s on %s: answer %+v", key, ids[i], ans)
					}
					owner = ids[i]
				case http.StatusTemporaryRedirect:
					other := ids[1-i]
					u, err := url.Parse(loc)
					if err != nil || u.Host != net.JoinHostPort(other, port) || u.Path != "/state/aggregate" ||
						u.Query().Get("key") != key || u.Query().Get("from") != ids[i] || len(u.Query()) != 2 {
						t.Fatalf("%s on %s: redirected to %q, want %s's /state/aggregate with key=%s&from=%s", key, ids[i], loc, other, key, ids[i])
					}
					// Asked after a redirect, the non-owner does not send it on.
					code, ans, _ := queryAt(t, p.metrics, path+"&from=elsewhere")
					if code != http.StatusMisdirectedRequest || ans.Owner != other {
						return fmt.Errorf("%s on %s after a redirect: %d %+v, want 421 naming %s", key, ids[i], code, ans, other)
					}
				default:
					return fmt.Errorf("%s on %s: %d %+v", key, ids[i], code, ans)
				}
			}
			if owner == "" {
				return fmt.Errorf("%s: no instance answered it", key)
			}
			// A client that follows redirects gets the answer from either.
			resp, err := http.Get("http://" + procs[0].metrics + path)
			if err != nil {
				return err
			}
			var ans queryAnswer
			err = json.NewDecoder(resp.Body).Decode(&ans)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || ans.Instance != owner {
				return fmt.Errorf("%s followed from %s: %d %+v (%v), want 200 from %s", key, ids[0], resp.StatusCode, ans, err, owner)
			}
		}
		return nil
	}
	for err := pending(); err != nil; err = pending() {
		if time.Now().After(deadline) {
			t.Fatalf("queries not settled within a minute: %v", err)
		}
		<-time.After(50 * time.Millisecond) // polling a condition, with a deadline
	}

	// Listing each instance's keys, five at a time: together they list
	// every key once, each with its aggregation, and each from its owner.
	listed := map[string]int{}
	for i, p := range procs {
		after := ""
		for page := 0; ; page++ {
			var ans listAnswer
			code := getJSON(t, p.metrics, "/state/aggregate?list&limit=5&after="+url.QueryEscape(after), &ans)
			if code != http.StatusOK || ans.Instance != ids[i] || len(ans.Entries) > 5 || len(ans.Partitions) == 0 {
				t.Fatalf("list on %s, page %d: %d %+v", ids[i], page, code, ans)
			}
			for _, e := range ans.Entries {
				var got check.Aggregation
				if err := json.Unmarshal(e.Value, &got); err != nil || e.Key == nil || got != check.Running(inputs[*e.Key])[len(inputs[*e.Key])-1] {
					t.Fatalf("list on %s: %+v (%s, %v)", ids[i], e, e.Value, err)
				}
				listed[*e.Key]++
			}
			if ans.Next == "" {
				break
			}
			after = ans.Next
		}
	}
	if len(listed) != len(inputs) {
		t.Fatalf("listed %d keys, want %d: %v", len(listed), len(inputs), listed)
	}
	for key, n := range listed {
		if n != 1 {
			t.Fatalf("key %s listed %d times", key, n)
		}
	}
	for _, bad := range []string{"limit=0", "limit=1001", "limit=x", "after=x", "after=-1:YQ", "after=1:%25", "key=k1"} {
		var ans listAnswer
		if code := getJSON(t, procs[0].metrics, "/state/aggregate?list&"+bad, &ans); code != http.StatusBadRequest || ans.Error == "" {
			t.Fatalf("list with %s: %d %+v", bad, code, ans)
		}
	}
	var none listAnswer
	if code := getJSON(t, procs[0].metrics, "/state/nosuch?list", &none); code != http.StatusNotFound {
		t.Fatalf("list of an unknown state: %d %+v", code, none)
	}

	// Refusals: no key, an unknown state, a key without state.
	p := procs[1]
	if code, ans, _ := queryAt(t, p.metrics, "/state/aggregate"); code != http.StatusBadRequest || !strings.Contains(ans.Error, "key=") {
		t.Fatalf("no key: %d %+v", code, ans)
	}
	if code, ans, _ := queryAt(t, p.metrics, "/state/nosuch?key=k1"); code != http.StatusNotFound || !strings.Contains(ans.Error, `["aggregate"]`) {
		t.Fatalf("unknown state: %d %+v", code, ans)
	}
	if code, ans, _ := queryAt(t, p.metrics, "/state/aggregate?key=a&key_base64=YQ"); code != http.StatusBadRequest {
		t.Fatalf("two keys: %d %+v", code, ans)
	}
	for _, p := range procs {
		code, ans, _ := queryAt(t, p.metrics, "/state/aggregate?key_base64=bm9uZQ&from=") // "none"; an empty from= still counts
		if code == http.StatusNotFound && ans.Error == "the key has no value" && *ans.Key == "none" {
			continue
		}
		if code != http.StatusMisdirectedRequest {
			t.Fatalf("absent key on %s: %d %+v", p.metrics, code, ans)
		}
	}
	for _, p := range procs {
		if err := p.stop(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v; log:\n%s", err, p.log.String())
		}
	}
}

// TestRedirectTo: the redirect keeps the peer URL's path before the
// request's (escaped as it came), replaces or adds from=, and is refused
// after a redirect, without a peer URL, and for an owner id that is no
// host name.
func TestRedirectTo(t *testing.T) {
	req := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	tests := []struct {
		peer, owner, req, want string
	}{
		{"http://{instance}.sluice:9090", "p-1", "/state/aggregate?key=k1", "http://p-1.sluice:9090/state/aggregate?from=p-0&key=k1"},
		{"https://{instance}.sluice/prefix/", "p-1", "/state/a%2Fb?key=k%201", "https://p-1.sluice/prefix/state/a%2Fb?from=p-0&key=k+1"},
		{"http://{instance}:9090", "127.0.0.3", "/state/count?key_base64=YQ", "http://127.0.0.3:9090/state/count?from=p-0&key_base64=YQ"},
		{"", "p-1", "/state/aggregate?key=k1", ""},
		{"http://{instance}:9090", "p-1", "/state/aggregate?key=k1&from=", ""},
		{"http://{instance}:9090", "p-1", "/state/aggregate?key=k1&from=p-2", ""},
		{"http://{instance}:9090", "user@evil", "/state/aggregate?key=k1", ""},
		{"http://{instance}:9090", "a:1", "/state/aggregate?key=k1", ""},
		{"http://{instance}:9090", "under_score", "/state/aggregate?key=k1", ""},
		{"http://{instance}:9090", "-dash", "/state/aggregate?key=k1", ""},
		{"http://{instance}:9090", strings.Repeat("a", 64), "/state/aggregate?key=k1", ""},
	}
	for _, tt := range tests {
		got, ok := redirectTo(tt.peer, tt.owner, "p-0", req(tt.req))
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("redirectTo(%q, %q, %q) = %q, %v; want %q", tt.peer, tt.owner, tt.req, got, ok, tt.want)
		}
	}
}

// getJSON GETs path at addr and decodes the JSON answer into v.
func getJSON(t *testing.T, addr, path string, v any) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return resp.StatusCode
}
