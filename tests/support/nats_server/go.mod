// The NATS server the clustered-broker tests run (tests/support/nats.py), built from this
// pinned module by scripts/install-go-peers.
module unskit.test/natsserver

go 1.22

require github.com/nats-io/nats-server/v2 v2.15.2
