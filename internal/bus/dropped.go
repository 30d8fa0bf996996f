package bus

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// APILimitAdvisory is the subject nats-server tells its system account
// on when its JetStream API queue overflowed and it dropped the requests
// queued (each an unanswered read or put, timed out at its client).
const APILimitAdvisory = server.JSAdvisoryAPILimitReached

// WatchDropped counts the JetStream API requests an embedded server ns
// drops: its system account's advisory is made heard in account (where
// nc, a client of ns, is), and dropped is called with each advisory's
// count. The server says the overflow in its log once a second however
// many there were; the advisory carries every count. Unsubscribe the
// subscription returned to stop.
func WatchDropped(ns *server.Server, account string, nc *nats.Conn, dropped func(n int64)) (*nats.Subscription, error) {
	sys := ns.SystemAccount()
	if sys == nil {
		return nil, fmt.Errorf("watch dropped requests: the server has no system account")
	}
	acc, err := ns.LookupAccount(account)
	if err != nil {
		return nil, fmt.Errorf("watch dropped requests: account %s: %w", account, err)
	}
	if err := sys.AddStreamExport(APILimitAdvisory, []*server.Account{acc}); err != nil {
		return nil, fmt.Errorf("watch dropped requests: export %s: %w", APILimitAdvisory, err)
	}
	if err := acc.AddStreamImport(sys, APILimitAdvisory, ""); err != nil {
		return nil, fmt.Errorf("watch dropped requests: import %s: %w", APILimitAdvisory, err)
	}
	sub, err := nc.Subscribe(APILimitAdvisory, func(m *nats.Msg) {
		var adv server.JSAPILimitReachedAdvisory
		if json.Unmarshal(m.Data, &adv) == nil && adv.Dropped > 0 {
			dropped(adv.Dropped)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watch dropped requests: subscribe %s: %w", APILimitAdvisory, err)
	}
	// Subscribed once the server has it: a drop right after is counted.
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("watch dropped requests: %w", err)
	}
	return sub, nil
}
