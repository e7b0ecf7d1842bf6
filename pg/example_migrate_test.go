package pg_test

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
)

// Every owner of tables hands out its migration lines; one function prints
// them all for a DBA (what "effectively migrate --print --kafka" prints),
// and pg.Migrate applies the same lines (what a consumer's Migrate and
// "effectively migrate" do). A consumer's own lines are its Migrations.
func ExampleMigrationSQL() {
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		panic(err)
	}
	lines := append([]pg.Line{parked.Line("", ""), kafka.OffsetsLine("", "")}, strategy.Migrations()...)
	script, err := pg.MigrationSQL("", lines...)
	if err != nil {
		panic(err)
	}
	// Each migration starts with a comment naming its line and version.
	heading := regexp.MustCompile(`^-- \S+:\S+ \d{3}_\w+$`)
	for _, l := range strings.Split(script, "\n") {
		if heading.MatchString(l) {
			fmt.Println(l)
		}
	}
	// Output:
	// -- consumer:parked 001_parked
	// -- consumer:parked 002_parked_lossless
	// -- kafka:kafka_offsets 001_offsets
	// -- kafka:kafka_offsets 002_high_offset
	// -- idset:effectively.processed 001_processed
}
