// Package readme keeps README.md's Go code compiling and true.
//
// Every ```go block of README.md is a whole file of the package
// examples/readme/ledger, named by an HTML comment on the line before the
// block:
//
//	<!-- examples/readme/ledger/ledger.go -->
//	```go
//	package ledger
//	...
//	```
//
// The files are built, vetted and tested with the rest of the module (the
// ledger's tests run it against a throwaway PostgreSQL, the in-process
// Kafka and the SQS emulator), and this package's test checks that each
// block and its file are the same, byte for byte once leading and trailing
// blank space is trimmed. To change a snippet, change the file, then copy
// it into README.md (or the other way round); the test says which block
// differs, and where.
package readme
