// Package fauxqs runs the fauxqs SQS emulator for tests.
//
// The emulator is the npm package fauxqs, pinned with a lock file in this
// directory. Install it once with
//
//	npm ci --prefix internal/fauxqs
//
// Tests call Endpoint, which starts one emulator per test binary on a free
// loopback port (node internal/fauxqs/start.mjs) and waits until it answers,
// or returns SQS_ENDPOINT unchanged when that variable is set, so the same
// tests run against another SQS endpoint. Client returns an SDK client
// pointed at the endpoint with static credentials, and NewQueue creates a
// queue with a unique name for one test.
//
// The emulator stops when Main (or Stop) is called, and in any case when the
// test binary exits: it watches its standard input, which is a pipe from the
// test binary, and stops when that pipe closes.
package fauxqs
