package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// The state queries: GET /state/{state}?key=… on the HTTP server answers
// with the key's committed state as JSON (sluice.Instance.Query, rendered
// by the job's QueryState). docs/queries.md is the contract.

// validPeerURL reports whether u is a SLUICE_QUERY_PEER_URL: an http or
// https URL whose host names {instance}.
func validPeerURL(u string) bool {
	const mark = "sluice-instance-mark"
	p, err := url.Parse(strings.ReplaceAll(u, "{instance}", mark))
	return err == nil && (p.Scheme == "http" || p.Scheme == "https") && strings.Contains(p.Hostname(), mark) &&
		p.RawQuery == "" && p.Fragment == ""
}

// queryable is a state the endpoint reads: the instance (or pipeline
// stage) that keeps it, and the job that reads it.
type queryable struct {
	in  *sluice.Instance
	job sluice.Job
}

// stateQueries serves GET /state/{state}.
type stateQueries struct {
	instance string // this instance's SLUICE_INSTANCE_ID
	peerURL  string // SLUICE_QUERY_PEER_URL, "" when unset
	// states maps each state name to where it is read; nil until the
	// instance is built.
	states atomic.Pointer[map[string]queryable]

	mu     sync.Mutex
	owners map[ownerKey]ownerAt // see owner
}

// serve makes the states of jobs queryable: every state a job lists in
// States, if it has a QueryState. A state name two pipeline stages share
// is the earlier stage's.
func (q *stateQueries) serve(jobs ...queryable) {
	m := map[string]queryable{}
	for _, j := range jobs {
		if j.job.QueryState == nil {
			continue
		}
		for _, st := range j.job.States {
			if _, taken := m[st]; !taken {
				m[st] = j
			}
		}
	}
	q.states.Store(&m)
}

// queryAnswer is the body of every answer.
type queryAnswer struct {
	State     string          `json:"state"`
	Key       *string         `json:"key,omitempty"`
	KeyBase64 []byte          `json:"key_base64,omitempty"`
	Partition *int32          `json:"partition,omitempty"`
	Instance  string          `json:"instance"`
	Value     json.RawMessage `json:"value,omitempty"`
	// Standby: the value is a standby replica's (stale=true), which
	// was StandbyLag changelog offsets behind at its last round.
	Standby    bool   `json:"standby,omitempty"`
	StandbyLag *int64 `json:"standby_lag,omitempty"`
	Owner      string `json:"owner,omitempty"`
	Error      string `json:"error,omitempty"`
}

func (q *stateQueries) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("list") {
		q.list(w, r)
		return
	}
	ans := queryAnswer{State: r.PathValue("state"), Instance: q.instance}
	reply := func(code int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(ans)
	}
	fail := func(code int, msg string) {
		ans.Error = msg
		reply(code)
	}
	key, err := queryKey(r.URL.Query())
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	ans.Key, ans.KeyBase64 = keyFields(key)
	stale := r.URL.Query().Get("stale")
	if stale != "" && stale != "true" && stale != "false" {
		fail(http.StatusBadRequest, fmt.Sprintf("stale=%q: want true or false", stale))
		return
	}
	st, code, msg := q.state(w, ans.State)
	if code != 0 {
		fail(code, msg)
		return
	}
	var found bool
	read := func(s kstate.Scope) (err error) {
		ans.Value, found, err = st.render(s, ans.State)
		return err
	}
	if stale == "true" {
		ans.Standby, err = st.in.QueryStale(key, read)
	} else {
		err = st.in.Query(key, read)
	}
	p := st.in.PartitionOf(key)
	ans.Partition = &p
	if lag, ok := st.in.StandbyLag(p); ans.Standby && ok {
		ans.StandbyLag = &lag
	}
	var nl *sluice.NotLocalError
	switch {
	case errors.As(err, &nl):
		q.notLocal(w, r, &ans, st.in, nl, key, reply)
	case err != nil:
		fail(http.StatusInternalServerError, err.Error())
	case !found:
		fail(http.StatusNotFound, "the key has no value")
	default:
		reply(http.StatusOK)
	}
}

// render reads state in s as the job's QueryState renders it, as JSON:
// false when the key has no value.
func (st queryable) render(s kstate.Scope, state string) (json.RawMessage, bool, error) {
	v, ok, err := st.job.QueryState(s, state)
	if err != nil || !ok {
		return nil, false, err
	}
	b, err := json.Marshal(v) // in the call: v may share the store's bytes
	return b, err == nil, err
}

// notLocal answers a query of a task that does not run here: redirected to
// its owner when SLUICE_QUERY_PEER_URL says where that is, else 421 naming
// it; 503 while it restores here or no member holds it.
func (q *stateQueries) notLocal(w http.ResponseWriter, r *http.Request, ans *queryAnswer, in *sluice.Instance, nl *sluice.NotLocalError, key []byte, reply func(int)) {
	retry := func(format string, args ...any) {
		ans.Error = fmt.Sprintf(format, args...)
		w.Header().Set("Retry-After", "1")
		reply(http.StatusServiceUnavailable)
	}
	switch {
	case nl.Partition < 0:
		ans.Partition = nil
		retry("the processor is not connected to the brokers")
		return
	case nl.Restoring:
		retry("task %d is restoring its state here", nl.Partition)
		return
	}
	owner, err := q.owner(r.Context(), in, key)
	switch {
	case err != nil:
		retry("task %d does not run here, and its owner is unknown: %v", nl.Partition, err)
		return
	case owner == "" || owner == q.instance:
		retry("task %d is moving between instances (a rebalance)", nl.Partition)
		return
	}
	ans.Owner = owner
	if to, ok := redirectTo(q.peerURL, owner, q.instance, r.URL); ok {
		http.Redirect(w, r, to, http.StatusTemporaryRedirect)
		return
	}
	ans.Error = fmt.Sprintf("task %d runs on instance %s", nl.Partition, owner)
	reply(http.StatusMisdirectedRequest)
}

// redirectTo is where a query u for a key that owner runs is sent: the
// peer URL with owner for {instance}, u's path after the peer URL's own,
// and u's query with from=self. There is one redirect: a query that has a
// from already is not sent on (an owner that has moved on since answers
// 421 or 503 itself). Nor is one without a peer URL, or for an owner
// whose id is no host name (another client in the group, say).
func redirectTo(peerURL, owner, self string, u *url.URL) (string, bool) {
	if peerURL == "" || u.Query().Has("from") || !hostLabel(owner) {
		return "", false
	}
	to, err := url.Parse(strings.ReplaceAll(peerURL, "{instance}", owner))
	if err != nil {
		return "", false
	}
	v := u.Query()
	v.Set("from", self)
	to = to.JoinPath(u.EscapedPath())
	to.RawQuery = v.Encode()
	return to.String(), true
}

// hostLabel reports whether id can stand in a host name as one DNS label:
// 1 to 63 letters, digits and '-', not starting or ending with '-'; or a
// dotted name of such labels (a loopback address in a test).
func hostLabel(id string) bool {
	if id == "" || len(id) > 253 {
		return false
	}
	for _, l := range strings.Split(id, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// ownerTTL is how long the handler keeps a task's owner: a burst of
// queries for another instance's keys asks the brokers once a second per
// task, not once a query.
const ownerTTL = time.Second

type ownerAt struct {
	id string
	at time.Time
}

// owner returns the instance id that runs key's task (QueryOwner), as
// known within ownerTTL.
func (q *stateQueries) owner(ctx context.Context, in *sluice.Instance, key []byte) (string, error) {
	p := in.PartitionOf(key)
	q.mu.Lock()
	o, ok := q.owners[ownerKey{in, p}]
	q.mu.Unlock()
	if ok && time.Since(o.at) < ownerTTL {
		return o.id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := in.QueryOwner(ctx, key)
	if err != nil {
		return "", err
	}
	q.mu.Lock()
	if q.owners == nil {
		q.owners = map[ownerKey]ownerAt{}
	}
	q.owners[ownerKey{in, got.Partition}] = ownerAt{got.InstanceID, time.Now()}
	q.mu.Unlock()
	return got.InstanceID, nil
}

type ownerKey struct {
	in *sluice.Instance
	p  int32
}

// queryKey reads the query's key: key=… (text) or key_base64=… (bytes,
// standard or URL-safe base64).
func queryKey(v url.Values) ([]byte, error) {
	k, has := v["key"]
	b, hasB := v["key_base64"]
	switch {
	case has == hasB:
		return nil, errors.New("give the key as key=… (text) or key_base64=… (base64), one of them")
	case has && k[0] != "":
		return []byte(k[0]), nil
	case has:
		return nil, errors.New("the key is empty: queries find a key's task by its partition, and the empty key has none")
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if key, err := enc.DecodeString(b[0]); err == nil && len(key) > 0 {
			return key, nil
		}
	}
	return nil, errors.New("key_base64 is not a non-empty base64 key")
}

// listAnswer is the body of a listing's answer.
type listAnswer struct {
	State    string `json:"state"`
	Instance string `json:"instance"`
	// Partitions are the tasks this page read, those running here (not
	// restoring) from the cursor's on: a listing covers no other.
	Partitions []int32     `json:"partitions"`
	Entries    []listEntry `json:"entries"`
	// Next is the after= of the next page; absent on the last.
	Next  string `json:"next,omitempty"`
	Error string `json:"error,omitempty"`
}

type listEntry struct {
	Key       *string         `json:"key,omitempty"`
	KeyBase64 []byte          `json:"key_base64,omitempty"`
	Partition int32           `json:"partition"`
	Value     json.RawMessage `json:"value"`
}

// Listing: at most maxList entries a page, defaultList unless limit= says.
const (
	defaultList = 100
	maxList     = 1000
)

// list answers GET /state/<state>?list[&limit=n][&after=cursor]: the keys
// of the state in the tasks that run on this instance, with their values,
// partition by partition and in each in the store's order (kstate.Keys),
// limit keys at a time, as Kafka Streams' store.all() lists a local store.
// Each value is read as a single key's query reads it (committed state
// only; a key whose value reads absent, expired say, is left out, so a
// page may hold fewer entries than keys), so the page is not one
// snapshot. next, when the listing goes on, is the cursor for after=;
// partitions names the tasks read, so a client sees what a page covered
// (a task restoring here is not running, and not read).
func (q *stateQueries) list(w http.ResponseWriter, r *http.Request) {
	ans := listAnswer{State: r.PathValue("state"), Instance: q.instance, Partitions: []int32{}, Entries: []listEntry{}}
	reply := func(code int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(ans)
	}
	fail := func(code int, msg string) {
		ans.Error = msg
		reply(code)
	}
	v := r.URL.Query()
	if v.Has("key") || v.Has("key_base64") {
		fail(http.StatusBadRequest, "list, or a key: not both")
		return
	}
	if v.Has("stale") {
		fail(http.StatusBadRequest, "stale: a listing reads the tasks running here, not standbys")
		return
	}
	limit := defaultList
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxList {
			fail(http.StatusBadRequest, fmt.Sprintf("limit=%s: want 1 to %d", l, maxList))
			return
		}
		limit = n
	}
	from, after, err := parseCursor(v.Get("after"))
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	st, code, msg := q.state(w, ans.State)
	if code != 0 {
		fail(code, msg)
		return
	}
	// The keys first, a page and one more (whether there is a next),
	// then each key's value as a query of it reads it.
	type found struct {
		p   int32
		key []byte
	}
	var keys []found
	errFull := errors.New("page full")
	err = st.in.QueryLocal(func(p int32, s kstate.Scope) error {
		if p < from || len(keys) > limit {
			return nil
		}
		ans.Partitions = append(ans.Partitions, p)
		var start []byte
		if p == from {
			start = after
		}
		return kstate.Keys(s, ans.State, start, func(k []byte) error {
			if len(keys) > limit {
				return errFull
			}
			keys = append(keys, found{p, slices.Clone(k)})
			return nil
		})
	})
	var nl *sluice.NotLocalError
	switch {
	case errors.Is(err, errFull):
	case errors.As(err, &nl):
		w.Header().Set("Retry-After", "1")
		fail(http.StatusServiceUnavailable, "no task runs here yet")
		return
	case err != nil:
		fail(http.StatusInternalServerError, err.Error())
		return
	}
	if len(keys) > limit {
		keys = keys[:limit]
		last := keys[limit-1]
		ans.Next = fmt.Sprintf("%d:%s", last.p, base64.RawURLEncoding.EncodeToString(last.key))
	}
	for _, k := range keys {
		e := listEntry{Partition: k.p}
		e.Key, e.KeyBase64 = keyFields(k.key)
		ok := false
		err := st.in.QueryPartition(k.p, k.key, func(s kstate.Scope) (err error) {
			e.Value, ok, err = st.render(s, ans.State)
			return err
		})
		switch {
		case errors.As(err, &nl):
			continue // the task moved on meanwhile
		case err != nil:
			fail(http.StatusInternalServerError, err.Error())
			return
		case ok:
			ans.Entries = append(ans.Entries, e)
		}
	}
	reply(http.StatusOK)
}

// state is the queryable state named name, or the status and error to
// answer: 503 (with Retry-After) while the processor starts, 404 for a
// name the jobs do not serve.
func (q *stateQueries) state(w http.ResponseWriter, name string) (queryable, int, string) {
	states := q.states.Load()
	if states == nil {
		w.Header().Set("Retry-After", "1")
		return queryable{}, http.StatusServiceUnavailable, "the processor is starting"
	}
	st, ok := (*states)[name]
	if !ok {
		return queryable{}, http.StatusNotFound, fmt.Sprintf("no state %q: the job's queryable states are %q", name, slices.Sorted(maps.Keys(*states)))
	}
	return st, 0, ""
}

// keyFields is how an answer names a key: as text when it is UTF-8, else
// as base64 bytes.
func keyFields(key []byte) (*string, []byte) {
	if utf8.Valid(key) {
		s := string(key)
		return &s, nil
	}
	return nil, key
}

// parseCursor reads a listing's after=: "<partition>:<key, base64 URL
// encoding without padding>", next's form; "" is the start.
func parseCursor(c string) (int32, []byte, error) {
	if c == "" {
		return 0, nil, nil
	}
	ps, ks, ok := strings.Cut(c, ":")
	p, err := strconv.ParseInt(ps, 10, 32)
	if !ok || err != nil || p < 0 {
		return 0, nil, fmt.Errorf("after=%s: want the next of a listing's answer", c)
	}
	key, err := base64.RawURLEncoding.DecodeString(ks)
	if err != nil {
		return 0, nil, fmt.Errorf("after=%s: want the next of a listing's answer", c)
	}
	return int32(p), key, nil
}
