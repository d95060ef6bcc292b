package main

// How every client of the driver connects (newClient), read from the environment in this one
// place: tests/harness/drivers.py sets these; unset, the driver connects in plaintext without
// authentication, as it always did.
//
//	KAFSCALE_DRIVER_SECURITY_PROTOCOL  PLAINTEXT (the default), SSL, SASL_PLAINTEXT or SASL_SSL
//	KAFSCALE_DRIVER_CA_FILE            SSL, SASL_SSL: PEM CA certificates to trust (default: the
//	                                   system's); the broker's name is checked against its address
//	KAFSCALE_DRIVER_SASL_MECHANISM     SASL_*: SCRAM-SHA-512 (the default), SCRAM-SHA-256 or PLAIN
//	KAFSCALE_DRIVER_SASL_USERNAME      SASL_*: the user (required)
//	KAFSCALE_DRIVER_SASL_PASSWORD      SASL_*: its password
//
// A variable the protocol does not use is an error rather than ignored.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

const envPrefix = "KAFSCALE_DRIVER_"

// securityOpts are the kgo options of the environment's security settings (none without them).
func securityOpts() ([]kgo.Opt, error) {
	protocol := os.Getenv(envPrefix + "SECURITY_PROTOCOL")
	caFile := os.Getenv(envPrefix + "CA_FILE")
	mechanism := os.Getenv(envPrefix + "SASL_MECHANISM")
	user := os.Getenv(envPrefix + "SASL_USERNAME")
	pass := os.Getenv(envPrefix + "SASL_PASSWORD")
	if protocol == "" {
		protocol = "PLAINTEXT"
	}
	var useTLS, useSASL bool
	switch protocol {
	case "PLAINTEXT":
	case "SSL":
		useTLS = true
	case "SASL_PLAINTEXT":
		useSASL = true
	case "SASL_SSL":
		useTLS, useSASL = true, true
	default:
		return nil, fmt.Errorf("%sSECURITY_PROTOCOL=%s: want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", envPrefix, protocol)
	}
	if !useTLS && caFile != "" {
		return nil, fmt.Errorf("%sCA_FILE: %s has no TLS", envPrefix, protocol)
	}
	if !useSASL {
		for _, name := range []string{"SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD"} {
			if os.Getenv(envPrefix+name) != "" {
				return nil, fmt.Errorf("%s%s: %s has no SASL", envPrefix, name, protocol)
			}
		}
	}
	var opts []kgo.Opt
	if useTLS {
		config := &tls.Config{MinVersion: tls.VersionTLS12}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("%sCA_FILE: %w", envPrefix, err)
			}
			config.RootCAs = x509.NewCertPool()
			if !config.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%sCA_FILE %s: no PEM certificate", envPrefix, caFile)
			}
		}
		opts = append(opts, kgo.DialTLSConfig(config)) // ServerName: the dialed host
	}
	if useSASL {
		if user == "" {
			return nil, fmt.Errorf("%sSASL_USERNAME is required with %s", envPrefix, protocol)
		}
		var chosen sasl.Mechanism
		switch mechanism {
		case "", "SCRAM-SHA-512":
			chosen = scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
		case "SCRAM-SHA-256":
			chosen = scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
		case "PLAIN":
			chosen = plain.Auth{User: user, Pass: pass}.AsMechanism()
		default:
			return nil, fmt.Errorf("%sSASL_MECHANISM=%s: want SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN", envPrefix, mechanism)
		}
		opts = append(opts, kgo.SASL(chosen))
	}
	return opts, nil
}

// newClient is kgo.NewClient with the environment's security settings: every client of the
// driver is made here.
func newClient(opts ...kgo.Opt) (*kgo.Client, error) {
	security, err := securityOpts()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(opts, security...)...)
}
