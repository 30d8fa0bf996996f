// Package auth is poolplanner's security model on NATS: an operator and
// three accounts, whose keys sign a .creds file per role; and each role's
// permissions, the least it needs. The same keys configure the embedded
// server (planner serve --auth) or an external one (ServerConfig).
//
// The accounts: POOLPLANNER holds every stream, bucket and object store
// and only the planner joins it; POOLPLANNER_CLIENTS is where reporters,
// launchers and admins connect, with no JetStream of its own; SYS is the
// server's. A client reaches the planner's account only through the
// exports it imports (the service endpoints, the JetStream calls that
// read, its own inventory key, the spec keys). NATS checks what a client
// publishes to, never the reply subject it names, and JetStream and the
// planner answer to whatever reply a request carries; a request that
// crosses an import has its reply replaced by the server with a subject
// of its own (_R_...) in the planner's account, mapped back on the way
// out, so no reply a client names can be a stream's subject there.
package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/poolplanner/poolplanner/client"
)

// Role is what a set of credentials may do.
type Role string

// The roles. A reporter's credentials are for one node.
const (
	// Admin sets and removes specs, drains and undrains nodes and GPUs,
	// and reads everything.
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

// AccountName names the account poolplanner's state lives in, which
// only the planner joins; ClientsAccountName the account of every other
// role.
const (
	AccountName        = "POOLPLANNER"
	ClientsAccountName = "POOLPLANNER_CLIENTS"
)

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
	operator, account, system, clients nkeys.KeyPair
	// OperatorJWT is the operator's self-signed JWT, which the server
	// trusts; AccountJWT, ClientsJWT and SystemJWT are the accounts',
	// signed by it.
	OperatorJWT, AccountJWT, ClientsJWT, SystemJWT string
	// AccountKey, ClientsKey and SystemKey are the accounts' public keys.
	AccountKey, ClientsKey, SystemKey string
	// splitAt, when not zero, is when keys made before the clients'
	// account had it added: every user the planner's account signed up
	// to then is revoked (launchers, reporters and admins of that time
	// were in the planner's account; their credentials must be made
	// again).
	splitAt int64
}

// keyFiles are the seeds Open keeps, under DIR/auth. The clients'
// account's key is derived from account.nk's (clientsKeyOf).
var keyFiles = [...]string{"operator.nk", "account.nk", "system.nk"}

// splitFile records when the clients' account was added to older keys
// ("0": keys made with it).
const splitFile = "clients-since"

// ErrNoKeys is Load's answer where no keys were made yet.
var ErrNoKeys = errors.New("no keys yet")

// Open loads the authority kept under dir/auth, creating its keys (files
// readable by the owner only) the first time.
func Open(dir string) (*Authority, error) { return open(dir, true) }

// Load loads the authority kept under dir/auth; ErrNoKeys if there is
// none. Commands that only sign (planner creds) use it, so that a wrong
// --data-dir is an error, not a new authority nobody trusts.
func Load(dir string) (*Authority, error) { return open(dir, false) }

func open(dir string, create bool) (*Authority, error) {
	keyDir := filepath.Join(dir, "auth")
	if create {
		if err := os.MkdirAll(keyDir, 0o700); err != nil {
			return nil, fmt.Errorf("auth keys: %w", err)
		}
	}
	if err := private(keyDir, true); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("auth keys in %s: %w (planner serve --auth or planner auth init makes them)", keyDir, ErrNoKeys)
		}
		return nil, err
	}
	// Keys made before the clients' account had no split file: their
	// account may have signed every role, and those users are revoked.
	_, statErr := os.Stat(filepath.Join(keyDir, keyFiles[1]))
	fresh := errors.Is(statErr, os.ErrNotExist)
	makers := [...]func() (nkeys.KeyPair, error){nkeys.CreateOperator, nkeys.CreateAccount, nkeys.CreateAccount}
	var kps [len(keyFiles)]nkeys.KeyPair
	for i, name := range keyFiles {
		kp, err := loadOrCreate(filepath.Join(keyDir, name), makers[i], create)
		if err != nil {
			return nil, err
		}
		kps[i] = kp
	}
	clients, err := clientsKeyOf(kps[1])
	if err != nil {
		return nil, err
	}
	split, err := splitTime(keyDir, fresh)
	if err != nil {
		return nil, err
	}
	return newAuthority(kps[0], kps[1], kps[2], clients, split)
}

// clientsKeyOf is the clients' account key, derived from the planner's
// account seed: every host given the same keys (HA: DIR/auth copied)
// has the same clients' account, whatever poolplanner made the keys.
func clientsKeyOf(account nkeys.KeyPair) (nkeys.KeyPair, error) {
	seed, err := account.Seed()
	if err != nil {
		return nil, fmt.Errorf("clients account key: %w", err)
	}
	raw := sha256.Sum256(append([]byte("poolplanner clients account\x00"), seed...))
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, raw[:])
	if err != nil {
		return nil, fmt.Errorf("clients account key: %w", err)
	}
	return kp, nil
}

// splitTime is when the clients' account was added to these keys, kept
// in splitFile: 0 for keys made with it (fresh), else the first time
// keys without it are opened. Every user the planner's account signed
// up to then is revoked. The file is written (atomically) before
// anything is signed with the new layout, so that no crash can leave
// older credentials unrevoked.
func splitTime(keyDir string, fresh bool) (int64, error) {
	path := filepath.Join(keyDir, splitFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		var at int64
		if !fresh {
			// NATS revokes users issued at or before the time: every
			// one signed before this second, none from now on.
			at = time.Now().Unix() - 1
		}
		tmp, err := os.CreateTemp(keyDir, ".clients-since-*")
		if err != nil {
			return 0, fmt.Errorf("auth keys: %w", err)
		}
		defer os.Remove(tmp.Name())
		_, werr := tmp.WriteString(strconv.FormatInt(at, 10) + "\n")
		if werr == nil {
			werr = tmp.Sync()
		}
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		if werr == nil {
			werr = os.Rename(tmp.Name(), path)
		}
		if werr != nil {
			return 0, fmt.Errorf("auth keys: %s: %w", path, werr)
		}
		return at, nil
	}
	if err != nil {
		return 0, fmt.Errorf("auth keys: %w", err)
	}
	at, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("auth keys: %s: want a unix time: %w", path, err)
	}
	return at, nil
}

// private checks that path is this user's and nobody else's: whoever
// can write the keys (say, in a shared /tmp) can sign any credentials.
func private(path string, dir bool) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("auth keys: %w", err)
	}
	if fi.IsDir() != dir {
		return fmt.Errorf("auth keys: %s is not a %s", path, map[bool]string{true: "directory", false: "file"}[dir])
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("auth keys: %s has mode %#o; the keys must be the owner's only (chmod go-rwx)", path, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("auth keys: %s belongs to user %d, not to this user (%d)", path, st.Uid, os.Getuid())
	}
	return nil
}

// loadOrCreate reads a key's seed, or (with create) makes the key: the
// seed goes to a temporary file first and is linked into place, so a
// crash leaves no half-written key and two processes creating at once
// end up with the same one.
func loadOrCreate(path string, create func() (nkeys.KeyPair, error), mayCreate bool) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && mayCreate {
		kp, err := create()
		if err != nil {
			return nil, fmt.Errorf("create key %s: %w", path, err)
		}
		if seed, err = kp.Seed(); err != nil {
			return nil, fmt.Errorf("create key %s: %w", path, err)
		}
		tmp, err := os.CreateTemp(filepath.Dir(path), ".new-key-*")
		if err != nil {
			return nil, fmt.Errorf("write key %s: %w", path, err)
		}
		defer os.Remove(tmp.Name())
		_, werr := tmp.Write(seed)
		if werr == nil {
			werr = tmp.Sync()
		}
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		if werr == nil {
			werr = os.Link(tmp.Name(), path)
		}
		if errors.Is(werr, os.ErrExist) {
			return loadOrCreate(path, create, false) // another process made it first
		}
		if werr != nil {
			return nil, fmt.Errorf("write key %s: %w", path, werr)
		}
		return kp, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("auth key %s: %w", path, ErrNoKeys)
	}
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w", path, err)
	}
	if err := private(path, false); err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return kp, nil
}

// newAuthority signs the operator's and accounts' JWTs.
func newAuthority(operator, account, system, clients nkeys.KeyPair, splitAt int64) (*Authority, error) {
	a := &Authority{operator: operator, account: account, system: system, clients: clients, splitAt: splitAt}
	opPub, _ := operator.PublicKey()
	a.AccountKey, _ = account.PublicKey()
	a.SystemKey, _ = system.PublicKey()
	a.ClientsKey, _ = clients.PublicKey()
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
	cc := jwt.NewAccountClaims(a.ClientsKey)
	cc.Name = ClientsAccountName
	for _, e := range exports {
		ac.Exports.Add(&jwt.Export{Name: e.subject, Subject: jwt.Subject(e.subject), Type: e.kind, ResponseType: e.responses})
		cc.Imports.Add(&jwt.Import{Name: e.subject, Subject: jwt.Subject(e.subject), Account: a.AccountKey, Type: e.kind})
	}
	if splitAt != 0 {
		ac.Revocations = jwt.RevocationList{}
		ac.Revocations.Revoke(jwt.All, time.Unix(splitAt, 0))
	}
	if a.AccountJWT, err = ac.Encode(operator); err != nil {
		return nil, fmt.Errorf("account jwt: %w", err)
	}
	if a.ClientsJWT, err = cc.Encode(operator); err != nil {
		return nil, fmt.Errorf("clients account jwt: %w", err)
	}
	sc := jwt.NewAccountClaims(a.SystemKey)
	sc.Name = "SYS"
	if a.SystemJWT, err = sc.Encode(operator); err != nil {
		return nil, fmt.Errorf("system account jwt: %w", err)
	}
	return a, nil
}

// export is one subject the planner's account offers the clients'.
type export struct {
	subject   string
	kind      jwt.ExportType
	responses jwt.ResponseType
}

// exports are all the clients' account can reach of the planner's: what
// any client role needs, each role's own permissions narrowing it
// further. Every one is a service (a request whose reply the server
// remaps) but one: _INBOX.>, where the consumers a client creates
// deliver (object reads are push consumers) and which no stream stores.
// Nothing here writes a stream but the three buckets' keys (inventory, specs, drains), and what
// JetStream answers goes to the remapped reply. Streaming responses
// where one request gets several messages (a fetch, a batch get,
// $SRV discovery).
var exports = []export{
	{client.ValidateSubject, jwt.Service, jwt.ResponseTypeSingleton},
	{client.LookupSubject, jwt.Service, jwt.ResponseTypeSingleton},
	{client.PlanSubject, jwt.Service, jwt.ResponseTypeSingleton},
	{"$SRV.>", jwt.Service, jwt.ResponseTypeStream},
	{"$KV." + client.InventoryBucket + ".>", jwt.Service, jwt.ResponseTypeSingleton},
	{"$KV." + client.SpecBucket + ".>", jwt.Service, jwt.ResponseTypeSingleton},
	{"$KV." + client.DrainBucket + ".>", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.INFO", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.STREAM.INFO.*", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.STREAM.NAMES", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.STREAM.LIST", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.STREAM.MSG.GET.*", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.DIRECT.GET.>", jwt.Service, jwt.ResponseTypeStream},
	{"$JS.API.CONSUMER.CREATE.>", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.CONSUMER.INFO.*.*", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.CONSUMER.DELETE.*.*", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.CONSUMER.NAMES.*", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.CONSUMER.LIST.*", jwt.Service, jwt.ResponseTypeSingleton},
	{"$JS.API.CONSUMER.MSG.NEXT.*.*", jwt.Service, jwt.ResponseTypeStream},
	{"$JS.FC.>", jwt.Service, jwt.ResponseTypeSingleton},
	{"_INBOX.>", jwt.Stream, ""},
}

// RouteSecret is the password servers of one cluster, started with the
// same keys, present to each other on their routes: none but they can
// join the cluster.
func (a *Authority) RouteSecret() string {
	seed, _ := a.account.Seed()
	sum := sha256.Sum256(append([]byte("poolplanner routes\x00"), seed...))
	return hex.EncodeToString(sum[:])
}

// Operator is the operator's claims, for a server's trusted operators.
func (a *Authority) Operator() *jwt.OperatorClaims {
	oc, _ := jwt.DecodeOperatorClaims(a.OperatorJWT) // ours: cannot fail
	return oc
}

// Creds is a .creds file (user JWT and seed) for role; node names the
// reporter's node and is refused for the other roles. expires, when not
// zero, is how long the credentials work.
func (a *Authority) Creds(role Role, node string, expires time.Duration) ([]byte, error) {
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
	uc.Permissions = Permissions(role, node, pub)
	if expires > 0 {
		uc.Expires = time.Now().Add(expires).Unix()
	}
	token, err := uc.Encode(a.signer(role))
	if err != nil {
		return nil, fmt.Errorf("user jwt: %w", err)
	}
	seed, _ := user.Seed()
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return nil, err
	}
	// Outside the two blocks a .creds file is free text.
	note := fmt.Sprintf("poolplanner %s credentials; replies come to this user's inbox prefix only:\n  nats --creds FILE --inbox-prefix %s ...\n\n",
		role, InboxPrefix(pub))
	return append([]byte(note), creds...), nil
}

// signer is the account a role's users belong to: the planner's own
// for the planner, the clients' for every other role.
func (a *Authority) signer(role Role) nkeys.KeyPair {
	if role == Planner {
		return a.account
	}
	return a.clients
}

// Current says whether creds, a .creds file, still works with these
// keys as its role's: signed by the right account and not revoked. A
// file made before the clients' account existed is not (its user sits
// in the planner's account).
func (a *Authority) Current(creds []byte) bool {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return false
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return false
	}
	id, err := IdentityOf(creds)
	if err != nil || id.Role == "" {
		return false
	}
	want, _ := a.signer(id.Role).PublicKey()
	if uc.Issuer != want {
		return false
	}
	return id.Role != Planner || a.splitAt == 0 || uc.IssuedAt > a.splitAt
}

// Identity is what a .creds file says of itself: its role and, for a
// reporter, its node. Commands read it to refuse, with a clear message,
// what the server would deny.
type Identity struct {
	Role Role
	Node string
	// Inbox is the inbox prefix the credentials must use; "" for NATS's
	// default, _INBOX.
	Inbox string
	// Expires is when the credentials stop working; zero: never.
	Expires time.Time
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
	if id.Role != "" {
		id.Inbox = InboxPrefix(uc.Subject)
	}
	if uc.Expires > 0 {
		id.Expires = time.Unix(uc.Expires, 0)
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
	// A push consumer's flow control (an object read) is answered here.
	"$JS.FC.>",
}

// plannerOnlyConsumers are the consumer operations refused to every
// client on the streams the planner plans from (the inventory, the
// specs and the drains). A stream's consumers share one cap (the server's default,
// 1,000 a stream) whoever makes them, and NATS counts no account's or
// user's share of it apart (the clients' consumers live in the
// planner's account, through the import), so a client holding every
// slot would leave a restarted planner unable to watch what it plans
// from. Clients read those streams without consumers: direct gets, and
// the stream's subjects for a listing (store's List). Nor may they look
// up, read or delete a consumer there by name: all are the planner's.
// The unnamed $JS.API.CONSUMER.CREATE.<stream> and
// $JS.API.CONSUMER.DURABLE.CREATE.> are no client's on any stream
// (readStreams has neither).
var plannerOnlyConsumers = []string{
	"$JS.API.CONSUMER.*.KV_" + client.InventoryBucket + ".>",
	"$JS.API.CONSUMER.MSG.NEXT.KV_" + client.InventoryBucket + ".*",
	"$JS.API.CONSUMER.*.KV_" + client.SpecBucket + ".>",
	"$JS.API.CONSUMER.MSG.NEXT.KV_" + client.SpecBucket + ".*",
	"$JS.API.CONSUMER.*.KV_" + client.DrainBucket + ".>",
	"$JS.API.CONSUMER.MSG.NEXT.KV_" + client.DrainBucket + ".*",
}

// Permissions is what role may publish and subscribe to; user is the
// user's public key, which names a reporter's own inbox. A reporter's
// are for its node alone; nobody but the planner may subscribe to the
// service's subjects (so nobody else can answer them) or publish plans.
//
// Readers (launcher, admin) may subscribe to inboxes only, never to a
// subject a stream stores: a consumer they create may be a push consumer
// delivering anywhere, and were they listening on, say,
// poolplanner.assignments.X, its deliveries would have an audience there,
// and the assignments stream would store them, old assignments
// replayed as new. With no audience the server delivers nothing. They
// read streams through consumers that deliver to their inboxes (what
// every poolplanner command and nats.go's consumers do).
func Permissions(role Role, node, user string) jwt.Permissions {
	var p jwt.Permissions
	switch role {
	case Planner:
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(">")
	case Reporter:
		key := "$KV." + client.InventoryBucket + "." + node
		stream := "KV_" + client.InventoryBucket
		p.Pub.Allow.Add(key, "$JS.API.STREAM.INFO."+stream, "$JS.API.DIRECT.GET."+stream+"."+key)
	case Launcher:
		p.Pub.Allow.Add(readStreams...)
		p.Pub.Allow.Add(services...)
		p.Pub.Allow.Add("$SRV.>")
		p.Pub.Deny.Add(plannerOnlyConsumers...)
	case Admin:
		p.Pub.Allow.Add(readStreams...)
		p.Pub.Allow.Add(services...)
		p.Pub.Allow.Add("$SRV.>", "$KV."+client.SpecBucket+".>", "$KV."+client.DrainBucket+".>", "$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
			"$JS.API.CONSUMER.NAMES.*", "$JS.API.CONSUMER.LIST.*")
		p.Pub.Deny.Add(plannerOnlyConsumers...)
	}
	if role != Planner {
		// Its own inbox, not everyone's: no client reads the replies to
		// another's requests (nor learns where the planner's go).
		p.Sub.Allow.Add(InboxPrefix(user) + ".>")
	}
	return p
}

// InboxPrefix is the inbox prefix of a user: replies to its requests
// come there, and its credentials let it listen there only. Clients
// with the credentials use it (bus.Security does; with the nats CLI,
// --inbox-prefix, which planner creds prints).
func InboxPrefix(user string) string { return "_INBOX." + user }

// ServerConfig is the part of a nats-server configuration that makes an
// external server trust these credentials (operator mode, the three
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
	fmt.Fprintf(&b, "  %s: %s\n", a.ClientsKey, a.ClientsJWT)
	fmt.Fprintf(&b, "  %s: %s\n", a.SystemKey, a.SystemJWT)
	b.WriteString("}\n")
	return b.String()
}
