package idempotency

// LockKey is the advisory lock key of (scope, key), for tests that hold it
// from another session.
var LockKey = lockKey
