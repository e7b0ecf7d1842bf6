package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
)

// keySample is how many of the messages the group consumed before its
// stored offset the key check tries other key settings on.
const keySample = 100

// keyCandidate is a key setting the consumers may use, as the flags that
// select it.
type keyCandidate struct {
	flags string
	kf    consumer.KeyFunc
}

// keyWarnings explains a dry run in which none of the n messages the group
// consumed before its stored offset has a marker under the key setting
// given: whether the scope has markers at all and, if so, which other key
// setting finds the markers of the sample, when one does.
func (a *app) keyWarnings(ctx context.Context, pool *pgxpool.Pool, s dedupe.Strategy, o *replayOpts, n int64, sample []*consumer.Message) []string {
	consequence := "and the replay would apply each of them a second time"
	if insp, ok := s.(dedupe.Inspector); ok {
		if ms, err := insp.MarkerStats(ctx, pool, o.scope); err == nil {
			var markers int64
			for _, sc := range ms.Scopes {
				if sc.Scope == o.scope {
					markers += sc.Markers
				}
			}
			if markers == 0 {
				return []string{fmt.Sprintf("scope %q has no markers in %s: none of the %d message(s) the group consumed before its stored offset is recognised: either none of them was applied, or the consumers keep their markers elsewhere %s. "+
					"--scope must be the consumers' scope (their Config.Scope, which defaults to Config.Name), with their --strategy, --schema and --markers-table; "+
					"or their markers were swept (retention)", o.scope, orDash(ms.Table), n, consequence)}
			}
		}
	}
	msg := fmt.Sprintf("none of the %d message(s) the group consumed before its stored offset has a marker in scope %q under %s: "+
		"either none of them was applied (they were skipped), or the consumers derive their keys another way %s",
		n, o.scope, keyFlags(o.keyName, o.idHeader), consequence)
	best, hits, tried, err := a.probeKeys(ctx, pool, s, o, sample)
	switch {
	case err != nil:
		msg += fmt.Sprintf(". (Trying other key settings failed: %v)", err)
	case hits > 0:
		msg += fmt.Sprintf(". The consumers' markers match %s: it finds a marker for %d of %d sampled message(s). Run the dry run again with it", best, hits, len(sample))
	default:
		msg += fmt.Sprintf(". No other key setting tried finds one either: %s", strings.Join(tried, "; "))
	}
	return []string{msg}
}

// keyFlags renders a key setting as the flags that select it.
func keyFlags(name, idHeader string) string {
	if name == "id" {
		return "--key id --id-header " + idHeader
	}
	return "--key " + name
}

// probeKeys claims the sample's keys under each other key setting, each
// in a savepoint rolled back, and returns the setting that finds the most
// markers (a duplicate or a mismatch) and how many it found.
func (a *app) probeKeys(ctx context.Context, pool *pgxpool.Pool, s dedupe.Strategy, o *replayOpts, sample []*consumer.Message) (best string, hits int, tried []string, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", 0, nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(o.lockTimeout.Milliseconds(), 10)); err != nil {
		return "", 0, nil, err
	}
	for _, c := range a.keyCandidates(o, sample) {
		tried = append(tried, c.flags)
		sp, err := tx.Begin(ctx)
		if err != nil {
			return "", 0, tried, err
		}
		cls, err := consumer.Classify(ctx, sp, consumer.Config{
			Name: o.scope, Scope: o.scope, Strategy: s, KeyFunc: c.kf, NoFingerprint: o.noFP, MaxKeyLen: o.maxKeyLen,
		}, sample)
		_ = sp.Rollback(ctx)
		if err != nil {
			continue
		}
		found := 0
		for _, cl := range cls {
			if cl.Err == nil && (cl.Verdict == dedupe.VerdictDuplicate || cl.Verdict == dedupe.VerdictMismatch) {
				found++
			}
		}
		if found > hits {
			best, hits = c.flags, found
		}
	}
	return best, hits, tried, nil
}

// keyCandidates are the key settings other than the one given: the
// default ID, from the ID header given and from each header of the sample;
// the offset; each top-level string or number field of the sample's JSON
// payloads; and the key functions the embedding program registered.
func (a *app) keyCandidates(o *replayOpts, sample []*consumer.Message) []keyCandidate {
	var out []keyCandidate
	if o.keyName != "id" {
		out = append(out, keyCandidate{keyFlags("id", o.idHeader), consumer.DefaultKey})
	}
	var headers []string
	for _, m := range sample {
		for _, h := range m.Headers {
			if h.Key != o.idHeader && len(headers) < 10 && !slices.Contains(headers, h.Key) {
				headers = append(headers, h.Key)
			}
		}
	}
	sort.Strings(headers)
	for _, h := range headers {
		out = append(out, keyCandidate{keyFlags("id", h), headerID(h)})
	}
	if o.keyName != "offset" {
		out = append(out, keyCandidate{"--key offset", offsetKey})
	}
	var fields []string
	for i, m := range sample {
		if i == 20 {
			break
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(m.Value, &obj) != nil {
			continue
		}
		for f, v := range obj {
			if len(v) > 0 && (v[0] == '"' || v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) && len(fields) < 20 && !slices.Contains(fields, f) {
				fields = append(fields, f)
			}
		}
	}
	sort.Strings(fields)
	for _, f := range fields {
		if name := "json:" + f; name != o.keyName {
			out = append(out, keyCandidate{"--key " + name, consumer.JSONField(f)})
		}
	}
	var names []string
	for n := range a.opts.KeyFuncs {
		if n != o.keyName {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, keyCandidate{"--key " + n, a.opts.KeyFuncs[n]})
	}
	return out
}

// headerID is the default key of a Kafka source whose IDHeader is name:
// that header's value, else topic/partition/offset.
func headerID(name string) consumer.KeyFunc {
	return func(m *consumer.Message) (dedupe.Key, error) {
		for _, h := range m.Headers {
			if h.Key == name && len(h.Value) > 0 {
				return dedupe.Key{ID: string(h.Value)}, nil
			}
		}
		if _, _, off, ok := kafka.Position(m); ok {
			return dedupe.Key{ID: m.Lane + "/" + strconv.FormatInt(off, 10)}, nil
		}
		return dedupe.Key{ID: m.ID}, nil
	}
}
