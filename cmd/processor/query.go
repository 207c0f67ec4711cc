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
	"strings"
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
}

// serve makes the states of job, run by in, queryable: every state the
// job lists in States, if it has a QueryState.
func (q *stateQueries) serve(in *sluice.Instance, job sluice.Job) {
	m := map[string]queryable{}
	if old := q.states.Load(); old != nil {
		maps.Copy(m, *old)
	}
	if job.QueryState != nil {
		for _, st := range job.States {
			m[st] = queryable{in: in, job: job}
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
	Owner     string          `json:"owner,omitempty"`
	Error     string          `json:"error,omitempty"`
}

func (q *stateQueries) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ans := queryAnswer{State: r.PathValue("state"), Instance: q.instance}
	reply := func(code int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(ans)
	}
	key, err := queryKey(r.URL.Query())
	if err != nil {
		ans.Error = err.Error()
		reply(http.StatusBadRequest)
		return
	}
	if utf8.Valid(key) {
		s := string(key)
		ans.Key = &s
	} else {
		ans.KeyBase64 = key
	}
	states := q.states.Load()
	if states == nil {
		ans.Error = "the processor is starting"
		w.Header().Set("Retry-After", "1")
		reply(http.StatusServiceUnavailable)
		return
	}
	st, ok := (*states)[ans.State]
	if !ok {
		ans.Error = fmt.Sprintf("no state %q: the job's queryable states are %q", ans.State, slices.Sorted(maps.Keys(*states)))
		reply(http.StatusNotFound)
		return
	}
	var found bool
	err = st.in.Query(key, func(s kstate.Scope) error {
		v, ok, err := st.job.QueryState(s, ans.State)
		if err != nil || !ok {
			return err
		}
		found = true
		ans.Value, err = json.Marshal(v) // in the call: v may share the store's bytes
		return err
	})
	var nl *sluice.NotLocalError
	switch {
	case errors.As(err, &nl):
		q.notLocal(w, r, &ans, nl, key, reply)
	case err != nil:
		ans.Error = err.Error()
		reply(http.StatusInternalServerError)
	case !found:
		ans.Partition = partitionOf(st.in, key)
		ans.Error = "the key has no value"
		reply(http.StatusNotFound)
	default:
		ans.Partition = partitionOf(st.in, key)
		reply(http.StatusOK)
	}
}

// partitionOf is key's task, for the answer.
func partitionOf(in *sluice.Instance, key []byte) *int32 {
	p := in.PartitionOf(key)
	return &p
}

// notLocal answers a query of a task that does not run here: redirected to
// its owner when SLUICE_QUERY_PEER_URL says where that is, else 421 naming
// it; 503 while it restores here or no member holds it.
func (q *stateQueries) notLocal(w http.ResponseWriter, r *http.Request, ans *queryAnswer, nl *sluice.NotLocalError, key []byte, reply func(int)) {
	if nl.Partition < 0 {
		ans.Error = "the processor is not connected to the brokers yet"
		w.Header().Set("Retry-After", "1")
		reply(http.StatusServiceUnavailable)
		return
	}
	ans.Partition = &nl.Partition
	if nl.Restoring {
		ans.Error = fmt.Sprintf("task %d is restoring its state here", nl.Partition)
		w.Header().Set("Retry-After", "1")
		reply(http.StatusServiceUnavailable)
		return
	}
	st := (*q.states.Load())[ans.State]
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	owner, err := st.in.QueryOwner(ctx, key)
	switch {
	case err != nil:
		ans.Error = fmt.Sprintf("task %d does not run here, and its owner is unknown: %v", nl.Partition, err)
		w.Header().Set("Retry-After", "1")
		reply(http.StatusServiceUnavailable)
		return
	case owner.InstanceID == "" || owner.InstanceID == q.instance:
		ans.Error = fmt.Sprintf("task %d is moving between instances (a rebalance)", nl.Partition)
		w.Header().Set("Retry-After", "1")
		reply(http.StatusServiceUnavailable)
		return
	}
	ans.Owner = owner.InstanceID
	if q.peerURL != "" && r.URL.Query().Get("from") == "" {
		// One redirect: an owner that has moved on since answers 421 or
		// 503 itself rather than sending the query on again.
		u := strings.ReplaceAll(q.peerURL, "{instance}", url.PathEscape(owner.InstanceID))
		to := strings.TrimSuffix(u, "/") + r.URL.EscapedPath() + "?" + r.URL.RawQuery + "&from=" + url.QueryEscape(q.instance)
		http.Redirect(w, r, to, http.StatusTemporaryRedirect)
		return
	}
	ans.Error = fmt.Sprintf("task %d runs on instance %s", nl.Partition, owner.InstanceID)
	reply(http.StatusMisdirectedRequest)
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
