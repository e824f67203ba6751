// Command natsauth writes the NATS credentials of the test environment into a directory:
//
//	nkey-user.seed, nkey-user.pub      a user of the TLS + nkey server (nats-tls)
//	nkey-unknown.seed                  a valid user seed that no server knows
//	operator.jwt, system.pub,
//	system.jwt, app.pub, app.jwt       the operator and accounts of the JWT server (nats-jwt);
//	                                   the app account may use JetStream
//	bridge.creds                       a user of the app account (JWT and seed)
//	unknown.creds                      a user signed by an account the operator does not know
//
// Built from the nkeys and jwt modules nats-server itself uses, so the formats match it.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: natsauth DIR")
		os.Exit(2)
	}
	if err := write(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "natsauth:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files := map[string][]byte{}

	user, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	if files["nkey-user.seed"], err = user.Seed(); err != nil {
		return err
	}
	pub, err := user.PublicKey()
	if err != nil {
		return err
	}
	files["nkey-user.pub"] = []byte(pub)
	unknown, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	if files["nkey-unknown.seed"], err = unknown.Seed(); err != nil {
		return err
	}

	operator, err := nkeys.CreateOperator()
	if err != nil {
		return err
	}
	opPub, err := operator.PublicKey()
	if err != nil {
		return err
	}
	_, sysPub, sysJWT, err := account(operator, "SYS", false)
	if err != nil {
		return err
	}
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "testenv"
	oc.SystemAccount = sysPub
	if files["operator.jwt"], err = encode(oc, operator); err != nil {
		return err
	}
	files["system.pub"], files["system.jwt"] = []byte(sysPub), []byte(sysJWT)

	app, appPub, appJWT, err := account(operator, "APP", true)
	if err != nil {
		return err
	}
	files["app.pub"], files["app.jwt"] = []byte(appPub), []byte(appJWT)
	if files["bridge.creds"], err = creds(app, "bridge"); err != nil {
		return err
	}

	// A user of an account that was never signed by the operator.
	stranger, err := nkeys.CreateAccount()
	if err != nil {
		return err
	}
	if files["unknown.creds"], err = creds(stranger, "unknown"); err != nil {
		return err
	}

	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// account creates an account signed by operator; jetstream enables unlimited JetStream.
func account(operator nkeys.KeyPair, name string, jetstream bool) (nkeys.KeyPair, string, string, error) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, "", "", err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, "", "", err
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetstream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
			MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1,
			MemoryMaxStreamBytes: -1, DiskMaxStreamBytes: -1,
		}
	}
	token, err := encode(ac, operator)
	if err != nil {
		return nil, "", "", err
	}
	return kp, pub, string(token), nil
}

// creds creates a user of account and formats its JWT and seed as a .creds file.
func creds(account nkeys.KeyPair, name string) ([]byte, error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	userPub, err := user.PublicKey()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(userPub)
	uc.Name = name
	token, err := uc.Encode(account)
	if err != nil {
		return nil, err
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}

func encode(claims jwt.Claims, signer nkeys.KeyPair) ([]byte, error) {
	token, err := claims.Encode(signer)
	return []byte(token), err
}
