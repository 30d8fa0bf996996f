// Package auth is poolplanner's security model on NATS: an operator, one
// account with JetStream (where all of poolplanner lives) and a system
// account, whose keys sign a .creds file per role; and each role's
// permissions, the least it needs. The same keys configure the embedded
// server (planner serve --auth) or an external one (ServerConfig).
package auth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/poolplanner/poolplanner/client"
)

// Role is what a set of credentials may do.
type Role string

// The roles. A reporter's credentials are for one node.
const (
	// Admin sets and removes specs and reads everything.
	Admin Role = "admin"
	// Planner runs planner serve: reads the inventory and specs, publishes
	// plans and assignments, serves the poolplanner endpoints, manages its
	// streams and buckets (and writes the inventory of its in-process
	// reporters).
	Planner Role = "planner"
	// Launcher follows plans and assignments and calls lookup, validate
	// and plan; it may read the account's streams (the inventory and specs
	// too) and writes nothing.
	Launcher Role = "launcher"
	// Reporter puts and deletes its own node's key of the inventory
	// bucket, nothing else.
	Reporter Role = "reporter"
)

// Roles lists the roles, for help texts and checks.
var Roles = []Role{Admin, Planner, Launcher, Reporter}

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !slices.Contains(Roles, r) {
		return "", fmt.Errorf("role %q: want one of admin, planner, launcher, reporter", s)
	}
	return r, nil
}

// AccountName names the account poolplanner lives in.
const AccountName = "POOLPLANNER"

// roleTag marks a user JWT with its role; nodeTag prefix its node.
const (
	roleTag = "poolplanner-role:"
	// Tags are lowercased by the jwt library, so the node goes in the
	// user's name, which is not.
	nodePrefix = "reporter "
)

// Authority holds the keys that sign poolplanner's credentials. Open
// loads it from a directory, creating the keys the first time.
type Authority struct {
	operator, account, system nkeys.KeyPair
	// OperatorJWT is the operator's self-signed JWT, which the server
	// trusts; AccountJWT and SystemJWT are the two accounts', signed by
	// it.
	OperatorJWT, AccountJWT, SystemJWT string
	// AccountKey and SystemKey are the accounts' public keys.
	AccountKey, SystemKey string
}

// keyFiles are the seeds Open keeps, under DIR/auth.
var keyFiles = [...]string{"operator.nk", "account.nk", "system.nk"}

// Open loads the authority kept under dir/auth, creating its keys (files
// readable by the owner only) the first time.
func Open(dir string) (*Authority, error) {
	keyDir := filepath.Join(dir, "auth")
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		return nil, fmt.Errorf("auth keys: %w", err)
	}
	makers := [...]func() (nkeys.KeyPair, error){nkeys.CreateOperator, nkeys.CreateAccount, nkeys.CreateAccount}
	var kps [3]nkeys.KeyPair
	for i, name := range keyFiles {
		kp, err := loadOrCreate(filepath.Join(keyDir, name), makers[i])
		if err != nil {
			return nil, err
		}
		kps[i] = kp
	}
	return newAuthority(kps[0], kps[1], kps[2])
}

func loadOrCreate(path string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		kp, err := create()
		if err != nil {
			return nil, fmt.Errorf("create key %s: %w", path, err)
		}
		if seed, err = kp.Seed(); err != nil {
			return nil, fmt.Errorf("create key %s: %w", path, err)
		}
		// O_EXCL: two processes creating the keys at once must not end up
		// with different ones.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return loadOrCreate(path, create)
		}
		if err != nil {
			return nil, fmt.Errorf("write key %s: %w", path, err)
		}
		_, werr := f.Write(seed)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return nil, fmt.Errorf("write key %s: %w", path, werr)
		}
		return kp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w", path, err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return kp, nil
}

// newAuthority signs the operator's and accounts' JWTs.
func newAuthority(operator, account, system nkeys.KeyPair) (*Authority, error) {
	a := &Authority{operator: operator, account: account, system: system}
	opPub, _ := operator.PublicKey()
	a.AccountKey, _ = account.PublicKey()
	a.SystemKey, _ = system.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "poolplanner"
	oc.SystemAccount = a.SystemKey
	var err error
	if a.OperatorJWT, err = oc.Encode(operator); err != nil {
		return nil, fmt.Errorf("operator jwt: %w", err)
	}
	ac := jwt.NewAccountClaims(a.AccountKey)
	ac.Name = AccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	if a.AccountJWT, err = ac.Encode(operator); err != nil {
		return nil, fmt.Errorf("account jwt: %w", err)
	}
	sc := jwt.NewAccountClaims(a.SystemKey)
	sc.Name = "SYS"
	if a.SystemJWT, err = sc.Encode(operator); err != nil {
		return nil, fmt.Errorf("system account jwt: %w", err)
	}
	return a, nil
}

// Operator is the operator's claims, for a server's trusted operators.
func (a *Authority) Operator() *jwt.OperatorClaims {
	oc, _ := jwt.DecodeOperatorClaims(a.OperatorJWT) // ours: cannot fail
	return oc
}

// Creds is a .creds file (user JWT and seed) for role; node names the
// reporter's node and is refused for the other roles.
func (a *Authority) Creds(role Role, node string) ([]byte, error) {
	if _, err := ParseRole(string(role)); err != nil {
		return nil, err
	}
	if (role == Reporter) != (node != "") {
		return nil, errors.New("a reporter's credentials need its node id, and only a reporter's")
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("user key: %w", err)
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = string(role)
	if role == Reporter {
		uc.Name = nodePrefix + node
	}
	uc.Tags.Add(roleTag + string(role))
	uc.Permissions = Permissions(role, node)
	token, err := uc.Encode(a.account)
	if err != nil {
		return nil, fmt.Errorf("user jwt: %w", err)
	}
	seed, _ := user.Seed()
	return jwt.FormatUserConfig(token, seed)
}

// Identity is what a .creds file says of itself: its role and, for a
// reporter, its node. Commands read it to refuse, with a clear message,
// what the server would deny.
type Identity struct {
	Role Role
	Node string
}

// IdentityOf reads the role of the credentials in a .creds file; the
// zero Identity for credentials poolplanner did not make.
func IdentityOf(creds []byte) (Identity, error) {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return Identity{}, fmt.Errorf("credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return Identity{}, fmt.Errorf("credentials: %w", err)
	}
	var id Identity
	for _, t := range uc.Tags {
		if r, ok := strings.CutPrefix(t, roleTag); ok {
			id.Role = Role(r)
		}
	}
	if id.Role == Reporter {
		id.Node = strings.TrimPrefix(uc.Name, nodePrefix)
	}
	return id, nil
}

// services are the subjects of the poolplanner micro service.
var services = []string{client.ValidateSubject, client.LookupSubject, client.PlanSubject}

// readStreams is what reading the account's streams takes: their info,
// direct gets, and ephemeral consumers (create, info, fetch, delete).
// Nothing here writes a message, a stream or its settings. (Wildcards,
// not a list per stream: a user JWT travels in the CONNECT line, which
// a server bounds to 4 KB by default.)
var readStreams = []string{
	"$JS.API.STREAM.INFO.*",
	"$JS.API.DIRECT.GET.*", "$JS.API.DIRECT.GET.*.>",
	"$JS.API.STREAM.MSG.GET.*",
	"$JS.API.CONSUMER.CREATE.*.>",
	"$JS.API.CONSUMER.INFO.*.*", "$JS.API.CONSUMER.DELETE.*.*",
	"$JS.API.CONSUMER.MSG.NEXT.*.*",
}

// Permissions is what role may publish and subscribe to. A reporter's
// are for its node alone; nobody but the planner may subscribe to the
// service's subjects (so nobody else can answer them) or publish plans.
func Permissions(role Role, node string) jwt.Permissions {
	var p jwt.Permissions
	inbox := "_INBOX.>"
	switch role {
	case Planner:
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(">")
	case Reporter:
		key := "$KV." + client.InventoryBucket + "." + node
		stream := "KV_" + client.InventoryBucket
		p.Pub.Allow.Add(key, "$JS.API.STREAM.INFO."+stream, "$JS.API.DIRECT.GET."+stream+"."+key)
		p.Sub.Allow.Add(inbox)
	case Launcher:
		p.Pub.Allow.Add(readStreams...)
		p.Pub.Allow.Add(services...)
		p.Pub.Allow.Add("$SRV.>")
		p.Sub.Allow.Add(inbox, client.PlanSubjectPrefix+">", client.AssignmentSubjectPrefix+">")
	case Admin:
		p.Pub.Allow.Add(readStreams...)
		p.Pub.Allow.Add(services...)
		p.Pub.Allow.Add("$SRV.>", "$KV."+client.SpecBucket+".>", "$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
			"$JS.API.CONSUMER.NAMES.*", "$JS.API.CONSUMER.LIST.*")
		p.Sub.Allow.Add(inbox, client.PlanSubjectPrefix+">", client.AssignmentSubjectPrefix+">", "$KV.>")
	}
	return p
}

// ServerConfig is the part of a nats-server configuration that makes an
// external server trust these credentials (operator mode, the two
// accounts preloaded into a memory resolver). Include it from the
// server's own configuration, which says where to listen and that
// JetStream is on.
func (a *Authority) ServerConfig() string {
	var b strings.Builder
	b.WriteString("# poolplanner's operator and accounts (planner auth init). Include this\n")
	b.WriteString("# from the server's configuration; credentials: planner creds ROLE.\n")
	fmt.Fprintf(&b, "operator: %s\n", a.OperatorJWT)
	fmt.Fprintf(&b, "system_account: %s\n", a.SystemKey)
	b.WriteString("resolver: MEMORY\n")
	b.WriteString("resolver_preload: {\n")
	fmt.Fprintf(&b, "  %s: %s\n", a.AccountKey, a.AccountJWT)
	fmt.Fprintf(&b, "  %s: %s\n", a.SystemKey, a.SystemJWT)
	b.WriteString("}\n")
	return b.String()
}
