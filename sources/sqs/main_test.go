package sqs_test

import (
	"testing"

	"github.com/effectively-once/effectively/internal/fauxqs"
)

func TestMain(m *testing.M) { fauxqs.Main(m) }
