package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/inventory"
)

// defaultDataDir is where serve keeps its state, and so its keys.
func defaultDataDir() string { return filepath.Join(os.TempDir(), "poolplanner") }

// newCredsCmd prints credentials for a role, signed by the keys under
// --data-dir (made there the first time).
func newCredsCmd() *cobra.Command {
	var dataDir, node, output, natsContext, server, tlsCA string
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "creds ROLE [--node-id ID] [--data-dir DIR] [--output FILE [--nats-context NAME [--server URL] [--tls-ca FILE]]]",
		Short: "Print NATS credentials (.creds) for a role: admin, planner, launcher, or reporter --node-id ID",
		Long: `creds prints a .creds file for ROLE on stdout, signed by the keys that
planner serve --auth (or planner auth init) keeps under --data-dir/auth:

  admin     set and remove specs, drain and undrain nodes and GPUs, read everything
  planner   run planner serve --server against a server that trusts these keys
  launcher  follow plans and assignments, call lookup, validate and plan
  reporter  put and delete the inventory key of node --node-id, nothing else

Replies to a user's requests come to its own inbox prefix only
(_INBOX.<its public key>, on the .creds file's second line); the nats CLI
must be told it (--inbox-prefix) or its requests go unanswered.
--nats-context NAME also saves a nats CLI context naming --output, the
server (--server), the CA (--tls-ca) and that inbox prefix, so that
nats --context NAME ... works as is.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := auth.ParseRole(args[0])
			if err != nil {
				return usageError{err}
			}
			if err := checkCredsNode(role, node); err != nil {
				return err
			}
			if expires < 0 {
				return usagef("--expires %s: must be >= 0", expires)
			}
			a, err := auth.Load(dataDirOr(dataDir))
			if err != nil {
				return err
			}
			if natsContext != "" {
				if err := checkContextName(natsContext); err != nil {
					return err
				}
				if output == "" {
					return usagef("--nats-context: a context names the credentials file: pass --output FILE too")
				}
			}
			creds, err := a.Creds(role, node, expires)
			if err != nil {
				return err
			}
			if output != "" {
				if err := writeSecret(output, creds); err != nil {
					return err
				}
				if natsContext == "" {
					return nil
				}
				id, err := auth.IdentityOf(creds)
				if err != nil {
					return err
				}
				path, err := writeNATSContext(natsContext, natsContextOf(role, output, server, tlsCA, id.Inbox))
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "nats context %s saved in %s: nats --context %s ... (inbox prefix %s)\n", natsContext, path, natsContext, id.Inbox)
				return nil
			}
			out := cmd.OutOrStdout()
			ownerOnly(out)
			_, err = out.Write(creds)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write the credentials to `FILE`, readable by its owner only (default: stdout)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "where the keys are kept, as for planner serve (default $TMPDIR/poolplanner)")
	cmd.Flags().StringVar(&node, "node-id", "", "the reporter's node id")
	cmd.Flags().StringVar(&natsContext, "nats-context", "", "also save a nats CLI context `NAME` for these credentials (with --output), with their inbox prefix")
	cmd.Flags().StringVar(&server, "server", defaultServer(), "with --nats-context: the NATS URL(s) the context connects to")
	cmd.Flags().StringVar(&tlsCA, "tls-ca", "", "with --nats-context: the CA certificate (PEM) the context trusts")
	durationVar(cmd.Flags(), &expires, "expires", 0, "the credentials stop working after this long (default: never; new keys are the only way to withdraw them)")
	return cmd
}

// writeSecret writes data to a new file path that only its owner may
// read: credentials hold a secret.
func writeSecret(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	// An existing file keeps its mode when opened: make it the owner's.
	err = f.Chmod(0o600)
	if _, werr := f.Write(data); err == nil {
		err = werr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--output %s: %w", path, err)
	}
	return nil
}

// ownerOnly makes w, when it is a file the shell made for a redirect
// (planner creds ROLE > x.creds; its umask gives others read access),
// readable by its owner only, before the secret is written to it.
func ownerOnly(w io.Writer) {
	f, ok := w.(*os.File)
	if !ok {
		return
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
		_ = f.Chmod(fi.Mode().Perm() &^ 0o077)
	}
}

func checkCredsNode(role auth.Role, node string) error {
	switch {
	case role == auth.Reporter && node == "":
		return usagef("a reporter's credentials are for one node: pass --node-id")
	case role != auth.Reporter && node != "":
		return usagef("--node-id is for a reporter's credentials only")
	case node != "":
		if err := inventory.ValidateNodeID(node); err != nil {
			return usagef("--node-id: %v", err)
		}
	}
	return nil
}

func dataDirOr(dir string) string {
	if dir == "" {
		return defaultDataDir()
	}
	return dir
}

// newAuthCmd sets up credentials for an external NATS server.
func newAuthCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "auth", Short: "Set up credentials for an external NATS server"}
	var dataDir string
	var reporters, exports []string
	initCmd := &cobra.Command{
		Use:   "init [--data-dir DIR] [--reporter NODE_ID]... [--export WHAT=PATH]...",
		Short: "Make the keys, a nats-server configuration that trusts them, and credentials",
		Long: `init makes (once) the operator and account keys under DIR/auth, and writes
DIR/nats-auth.conf, which a nats-server configuration includes to require
these credentials, and DIR/creds/admin.creds, planner.creds,
launcher.creds and reporter-NODE_ID.creds for each --reporter. Existing
credentials files are kept.

--export writes one of them somewhere else too, for a machine or
container that must get that file and nothing more: WHAT is
server-config, admin, planner, launcher or reporter:NODE_ID.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, n := range reporters {
				if err := checkCredsNode(auth.Reporter, n); err != nil {
					return err
				}
			}
			wants, err := parseExports(exports)
			if err != nil {
				return err
			}
			dir := dataDirOr(dataDir)
			a, err := auth.Open(dir)
			if err != nil {
				return err
			}
			if err := export(a, wants); err != nil {
				return err
			}
			conf := filepath.Join(dir, "nats-auth.conf")
			if err := os.WriteFile(conf, []byte(a.ServerConfig()), 0o600); err != nil {
				return fmt.Errorf("write %s: %w", conf, err)
			}
			paths, err := writeCreds(a, filepath.Join(dir, "creds"), []auth.Role{auth.Admin, auth.Planner, auth.Launcher}, reporters)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n%s\n", conf, strings.Join(paths, "\n"))
			return nil
		},
	}
	initCmd.Flags().StringVar(&dataDir, "data-dir", "", "where to keep the keys and write the files (default $TMPDIR/poolplanner)")
	initCmd.Flags().StringArrayVar(&reporters, "reporter", nil, "also write credentials for the reporter of this node (repeatable)")
	initCmd.Flags().StringArrayVar(&exports, "export", nil, "also write WHAT (server-config, admin, planner, launcher, reporter:NODE_ID) to PATH, if missing (repeatable)")
	cmd.AddCommand(initCmd)
	return cmd
}

// exportFile is one --export: the server's configuration (role "") or a
// role's credentials, written to path.
type exportFile struct {
	role       auth.Role
	node, path string
}

func parseExports(args []string) ([]exportFile, error) {
	var out []exportFile
	for _, arg := range args {
		what, path, ok := strings.Cut(arg, "=")
		if !ok || path == "" {
			return nil, usagef("--export %q: want WHAT=PATH", arg)
		}
		if what == "server-config" {
			out = append(out, exportFile{path: path})
			continue
		}
		r, node, _ := strings.Cut(what, ":")
		role, err := auth.ParseRole(r)
		if err != nil {
			return nil, usagef("--export %q: %v, or server-config", arg, err)
		}
		if err := checkCredsNode(role, node); err != nil {
			return nil, usagef("--export %q: %v", arg, err)
		}
		out = append(out, exportFile{role, node, path})
	}
	return out, nil
}

// export writes each wanted file that is missing or stale, owner-only:
// credentials the keys no longer honour, or a server configuration
// other than the keys' (after the clients' account was added, say).
func export(a *auth.Authority, wants []exportFile) error {
	for _, w := range wants {
		if old, err := os.ReadFile(w.path); err == nil {
			// A configuration written by these keys since the clients'
			// account exists preloads it (its JWTs differ at each
			// signing, so compare what they are for).
			if w.role == "" && strings.Contains(string(old), a.ClientsKey+":") && strings.Contains(string(old), a.AccountKey+":") || w.role != "" && a.Current(old) {
				continue
			}
		}
		data := []byte(a.ServerConfig())
		if w.role != "" {
			var err error
			if data, err = a.Creds(w.role, w.node, 0); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(filepath.Dir(w.path), 0o700); err != nil {
			return fmt.Errorf("--export %s: %w", w.path, err)
		}
		if err := os.WriteFile(w.path, data, 0o600); err != nil {
			return fmt.Errorf("--export %s: %w", w.path, err)
		}
	}
	return nil
}

// writeCreds writes dir/ROLE.creds for each role and
// dir/reporter-NODE.creds for each node, keeping files that exist and
// still work (they may have been handed out), and returns their paths
// in that order. A file the keys no longer honour (made before the
// clients' account existed) is written anew.
func writeCreds(a *auth.Authority, dir string, roles []auth.Role, nodes []string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	type want struct {
		role auth.Role
		node string
	}
	var all []want
	for _, r := range roles {
		all = append(all, want{r, ""})
	}
	for _, n := range nodes {
		all = append(all, want{auth.Reporter, n})
	}
	var paths []string
	for _, w := range all {
		name := string(w.role) + ".creds"
		if w.node != "" {
			name = "reporter-" + strings.ReplaceAll(w.node, "/", "_") + ".creds"
		}
		path := filepath.Join(dir, name)
		paths = append(paths, path)
		if old, err := os.ReadFile(path); err == nil && a.Current(old) {
			continue
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("credentials %s: %w", path, err)
		}
		creds, err := a.Creds(w.role, w.node, 0)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, creds, 0o600); err != nil {
			return nil, fmt.Errorf("credentials %s: %w", path, err)
		}
	}
	return paths, nil
}

// natsContextFile is a nats CLI context (ADR-21: one JSON file per
// context under $XDG_CONFIG_HOME/nats/context). Every key is written,
// none omitted, as the CLI writes them, so that one editing the file
// sees them all.
type natsContextFile struct {
	Description          string `json:"description"`
	URL                  string `json:"url"`
	Token                string `json:"token"`
	User                 string `json:"user"`
	Password             string `json:"password"`
	Creds                string `json:"creds"`
	NKey                 string `json:"nkey"`
	Cert                 string `json:"cert"`
	Key                  string `json:"key"`
	CA                   string `json:"ca"`
	NSC                  string `json:"nsc"`
	JetStreamDomain      string `json:"jetstream_domain"`
	JetStreamAPIPrefix   string `json:"jetstream_api_prefix"`
	JetStreamEventPrefix string `json:"jetstream_event_prefix"`
	InboxPrefix          string `json:"inbox_prefix"`
	UserJWT              string `json:"user_jwt"`
	TLSFirst             bool   `json:"tls_first"`
}

// natsContextOf is the context of role's credentials at credsPath: the
// files by absolute path (the CLI runs from anywhere), and the inbox
// prefix the credentials may receive replies on.
func natsContextOf(role auth.Role, credsPath, server, tlsCA, inbox string) natsContextFile {
	abs := func(p string) string {
		if p == "" {
			return ""
		}
		if a, err := filepath.Abs(p); err == nil {
			return a
		}
		return p
	}
	return natsContextFile{
		Description: fmt.Sprintf("poolplanner %s credentials (planner creds)", role),
		URL:         server, Creds: abs(credsPath), CA: abs(tlsCA), InboxPrefix: inbox,
	}
}

// checkContextName refuses a context name the CLI could not find again
// as a file of its context directory.
func checkContextName(name string) error {
	if name == "." || name == ".." || strings.ContainsAny(name, "/\\ ") || strings.HasPrefix(name, ".") {
		return usagef("--nats-context %q: want a name without /, \\ or spaces, not starting with a dot", name)
	}
	return nil
}

// natsConfigDir is where the nats CLI keeps its contexts:
// $XDG_CONFIG_HOME/nats, or ~/.config/nats (on every platform, as the
// CLI does).
func natsConfigDir() (string, error) {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("--nats-context: where the nats CLI keeps contexts: %w", err)
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// writeNATSContext saves c as context name and returns its path.
func writeNATSContext(name string, c natsContextFile) (string, error) {
	dir, err := natsConfigDir()
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("--nats-context: %w", err)
	}
	data, _ := json.MarshalIndent(c, "", "  ") // plain strings: cannot fail
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("--nats-context: %w", err)
	}
	return path, nil
}
