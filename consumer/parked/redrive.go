package parked

// Redrive outcomes, in RedriveItem.Outcome: what a redrive
// (consumer.Redrive) did with one parked row.
const (
	// RedriveApplied: the handler ran; its effect and the removal of the
	// parked row committed together.
	RedriveApplied = "applied"
	// RedriveDuplicate: the message's key was claimed by another delivery
	// since it was parked; the parked row was removed and nothing ran.
	RedriveDuplicate = "duplicate"
	// RedriveFailed: the handler (or the claim) failed; the row stays
	// parked, with attempts and last_error updated.
	RedriveFailed = "failed"
	// RedriveSkipped: the row cannot be redriven as it is (no key and no
	// KeyFunc, a key reused with another payload, a sequence gap); it stays
	// parked.
	RedriveSkipped = "skipped"
	// RedriveGone: the row was removed (redriven or purged) by someone else
	// between selection and redrive.
	RedriveGone = "gone"
)

// RedriveItem is what became of one parked row in a redrive.
type RedriveItem struct {
	ID  int64
	Ref string // exact, possibly not valid UTF-8
	// ParkCount is how many times the message was parked before (the same
	// message delivered and parked again shares its row).
	ParkCount int
	Reason    string // the reason it was parked
	Outcome   string // one of the Redrive* outcomes
	Err       error  // why it failed or was skipped
}

// RedriveResult counts the outcomes of a redrive and lists every row.
type RedriveResult struct {
	Applied, Duplicate, Failed, Skipped, Gone int
	Items                                     []RedriveItem
}

// Add counts it and appends it to Items.
func (r *RedriveResult) Add(it RedriveItem) {
	switch it.Outcome {
	case RedriveApplied:
		r.Applied++
	case RedriveDuplicate:
		r.Duplicate++
	case RedriveFailed:
		r.Failed++
	case RedriveSkipped:
		r.Skipped++
	case RedriveGone:
		r.Gone++
	}
	r.Items = append(r.Items, it)
}
