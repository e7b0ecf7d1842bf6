package outbox

// MaxRequestBytes is the most bytes the sink now puts in one request,
// lowered when the broker refuses a request as too large (for the
// external tests).
func (s *KafkaSink) MaxRequestBytes() int64 { return s.maxBytes.Load() }
