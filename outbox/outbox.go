package outbox

import (
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strings"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Partitions is the number of virtual partitions keys hash into. Each is
// leased to one relay at a time. It is fixed, so that every emitter and
// relay agrees on it.
const Partitions = 64

// Defaults.
const (
	DefaultSchema          = pg.DefaultSchema
	DefaultTable           = "outbox"
	DefaultMaxMessageBytes = 1 << 20
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Config configures an Outbox. The zero value is usable.
type Config struct {
	// Schema holds the outbox's tables. Defaults to DefaultSchema.
	Schema string
	// Table is the messages table; the other tables take it as a prefix
	// (Table_counters, Table_leases, Table_relays, Table_slots, and the log
	// table Table_log with Table_log_0, Table_log_1 and Table_log_half).
	// Defaults to DefaultTable.
	Table string
	// Sinks, when set, lists the sink names Emit accepts, so that a typo
	// fails at Emit instead of parking at the relay. Defaults to accepting
	// any non-empty name.
	Sinks []string
	// MaxMessageBytes is the largest message (key, value, headers and ID)
	// Emit accepts. Defaults to DefaultMaxMessageBytes (Kafka's default
	// message.max.bytes is about that).
	MaxMessageBytes int
	// Mode is the relay that reads the outbox, which decides what Emit
	// writes: LogMode for a LogRelay, TableMode for a Relay. Every Outbox
	// that emits into one table must have the mode of its relay. Defaults
	// to LogMode.
	Mode Mode
}

// Mode says which relay reads an outbox, and so what keeps a key's
// messages in commit order.
type Mode int

const (
	// LogMode is for an outbox read by LogRelay, which receives committed
	// transactions from the WAL in commit order: Emit writes its messages
	// as one row of the log table, whatever their number, and nothing else.
	// The table-polling Relay cannot order the keyed messages of a LogMode
	// outbox: it moves them to the messages table and parks them
	// (ErrUnordered).
	LogMode Mode = iota
	// TableMode is for an outbox read by the table-polling Relay (no
	// logical decoding, or connections through PgBouncer). Emit also takes
	// a per-(sink, key) counter row, held until the transaction ends, that
	// numbers the key's messages in commit order for the Relay, and sends
	// a NOTIFY that wakes it: a lock and an update per key per emit, about
	// half a stage's throughput. A LogRelay reads a TableMode outbox too.
	TableMode
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case LogMode:
		return "LogMode"
	case TableMode:
		return "TableMode"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Outbox adds messages to the outbox table inside the caller's transaction.
// It is safe for concurrent use.
type Outbox struct {
	cfg   Config
	sinks map[string]bool
	t     tables
	sql   string // the emit statement of cfg.Mode
}

type tables struct {
	messages, counters, leases, relays, slots string // quoted, schema-qualified
	log, logHalf                              string // the log table (LogMode) and its current half
	logParts                                  [2]string
	channel                                   string // raw channel name
	line                                      pg.Line
	// logNames are the log table's unquoted names (its halves too): what
	// the replication stream names its relations.
	logNames [3]string
}

func newTables(schema, table string) tables {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return tables{
		messages: q(table),
		counters: q(table + "_counters"),
		leases:   q(table + "_leases"),
		relays:   q(table + "_relays"),
		slots:    q(table + "_slots"),
		log:      q(table + "_log"),
		logHalf:  q(table + "_log_half"),
		logParts: [2]string{q(table + "_log_0"), q(table + "_log_1")},
		logNames: [3]string{table + "_log", table + "_log_0", table + "_log_1"},
		channel:  channel(schema, table),
		line: pg.Line{
			Name: "outbox:" + table,
			FS:   sub,
			Idents: map[string]string{
				"schema":     schema,
				"messages":   table,
				"counters":   table + "_counters",
				"leases":     table + "_leases",
				"relays":     table + "_relays",
				"slots":      table + "_slots",
				"log":        table + "_log",
				"log_first":  table + "_log_0",
				"log_second": table + "_log_1",
				"log_half":   table + "_log_half",
			},
		},
	}
}

// channel is the NOTIFY channel of an outbox: short enough for any schema
// and table name (channel names are cut at 63 bytes), and its own.
func channel(schema, table string) string {
	h := fnv.New64a()
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(table))
	return fmt.Sprintf("effectively_outbox_%016x", h.Sum64())
}

func (c *Config) defaults() error {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxMessageBytes < 0 {
		return fmt.Errorf("outbox: Config.MaxMessageBytes is negative")
	}
	if c.Mode != LogMode && c.Mode != TableMode {
		return fmt.Errorf("outbox: Config.Mode is %v, neither LogMode nor TableMode", c.Mode)
	}
	return checkNames(c.Schema, c.Table)
}

// checkNames refuses names PostgreSQL would cut or cannot hold: the
// longest table name, Table_counters, must fit in 63 bytes.
func checkNames(schema, table string) error {
	switch {
	case strings.ContainsRune(schema+table, 0):
		return errors.New("outbox: Schema and Table must not contain NUL")
	case len(schema) > 63:
		return fmt.Errorf("outbox: Schema %q is longer than PostgreSQL's 63 bytes", schema)
	case len(table+"_counters") > 63:
		return fmt.Errorf("outbox: Table %q is longer than 54 bytes (its tables add suffixes up to PostgreSQL's 63)", table)
	}
	return nil
}

// New returns an Outbox.
func New(cfg Config) (*Outbox, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	o := &Outbox{cfg: cfg, t: newTables(cfg.Schema, cfg.Table)}
	o.sql = o.t.emitSQL(cfg.Mode)
	if len(cfg.Sinks) > 0 {
		o.sinks = map[string]bool{}
		for _, s := range cfg.Sinks {
			if s == "" {
				return nil, errors.New("outbox: Config.Sinks holds an empty name")
			}
			o.sinks[s] = true
		}
	}
	return o, nil
}

// Line returns the outbox's migrations, for pg.Migrate and
// pg.MigrationSQL, the one way to migrate, beside a consumer's own:
//
//	pg.Migrate(ctx, pool, "", append(c.Migrations(), ob.Line())...)
func (o *Outbox) Line() pg.Line { return o.t.line }

// partition is the virtual partition of a message: its (sink, key), or
// its ID when it has no key.
func partition(sink string, key []byte, id string) int32 {
	h := fnv.New32a()
	h.Write([]byte(sink))
	h.Write([]byte{0})
	if key != nil {
		h.Write([]byte{1})
		h.Write(key)
	} else {
		h.Write([]byte{0})
		h.Write([]byte(id))
	}
	return int32(h.Sum32() % Partitions)
}

func (o *Outbox) validate(i int, m *Message) error {
	bad := func(format string, args ...any) error {
		return &MessageError{Index: i, Sink: m.Sink, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case m.Sink == "":
		return bad("empty sink")
	case o.sinks != nil && !o.sinks[m.Sink]:
		return bad("unknown sink (Config.Sinks lists the known ones)")
	case checkText(m.Sink) != "":
		return bad("sink name %s", checkText(m.Sink))
	case checkText(m.ID) != "":
		return bad("ID %s", checkText(m.ID))
	case len(m.ID) > dedupe.DefaultMaxIDLen:
		return bad("ID is %d bytes, longer than %d", len(m.ID), dedupe.DefaultMaxIDLen)
	}
	for _, h := range m.Headers {
		switch {
		case h.Key == "":
			return bad("header with an empty name")
		case checkText(h.Key) != "":
			return bad("header name %q %s", h.Key, checkText(h.Key))
		case strings.EqualFold(h.Key, IDHeader):
			return bad("header %q is set by the relay from Message.ID: set ID instead", h.Key)
		}
	}
	if n := m.size(); n > o.cfg.MaxMessageBytes {
		return bad("%d bytes, larger than MaxMessageBytes (%d)", n, o.cfg.MaxMessageBytes)
	}
	return nil
}
