package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// validate refuses settings that do not go together, then each
// component's options, named by their flags.
func (s *settings) validate() error {
	for _, check := range []func() error{s.validateSources, s.validateRedis, s.validateServe, s.validateStats,
		s.validateGlobal, s.svc.Validate, s.redis.Validate, s.lease.Validate, s.global.Validate, s.rlqs.Validate, s.tracing.Validate, s.xds.opts.Validate, s.stats.opts.Validate} {
		if err := check(); err != nil {
			return fielderr.Rename(err, flagOf)
		}
	}
	return nil
}

func (s *settings) validateGlobal() error {
	switch {
	case s.globalPolicy != "deny" && s.globalPolicy != "share":
		return fmt.Errorf("--global-partition %q: want deny or share", s.globalPolicy)
	case s.globalPolicy == "share" && (s.global.Share <= 0 || s.global.Share > 1):
		return fmt.Errorf("--global-partition share needs --global-partition-share above 0 and at most 1, got %v", s.global.Share)
	case s.globalPolicy != "share" && s.global.Share != 0:
		return errors.New("--global-partition-share needs --global-partition share")
	case s.globalDomains != "" && s.globalURL == "":
		return errors.New("--global-domains needs --global-redis-url: the home Redis global limits are drawn from")
	case s.globalDomains != "" && len(s.globalDomainList()) == 0:
		return fmt.Errorf("--global-domains %q: no domain named", s.globalDomains)
	case s.globalURL != "" && s.redisURL == "":
		return errors.New("--global-redis-url needs --redis-url: the region's own Redis decides everything else, and the partition share")
	}
	return nil
}

func (s *settings) validateSources() error {
	switch x := &s.xds; {
	case s.config == "" && x.opts.Server == "":
		return errors.New("--config is required (a rules file or directory; env " + envPrefix + "CONFIG), or --xds-server")
	case s.config != "" && x.opts.Server != "":
		return errors.New("--config and --xds-server both give the rules: use one")
	}
	return s.validateXDS()
}

func (s *settings) validateXDS() error {
	x := &s.xds
	switch {
	case x.beforeRules != "unavailable" && x.beforeRules != "ok":
		return fmt.Errorf("--xds-before-rules %q: want unavailable or ok", x.beforeRules)
	case x.opts.Server == "" && (x.tls || x.ca != "" || x.cert != "" || x.serverName != "" || x.nodeMeta != nil || x.headers != nil || x.startWithoutRules):
		return errors.New("--xds-* need --xds-server")
	}
	return certPair("xds", x.cert, x.key)
}

// certPair refuses a certificate without its key or a key without its
// certificate: --<prefix>-tls-cert and --<prefix>-tls-key go together.
func certPair(prefix, cert, key string) error {
	if (cert == "") != (key == "") {
		return fmt.Errorf("--%s-tls-cert and --%s-tls-key go together", prefix, prefix)
	}
	return nil
}

func (s *settings) validateRedis() error {
	if err := certPair("redis", s.redisTLSCert, s.redisTLSKey); err != nil {
		return err
	}
	switch {
	case s.redisURL == "" && (s.redis.Mode != "" || s.redisTLSCA != "" || s.redisTLSCert != "" || s.redisPassFile != "" || s.redisPerSecondURL != ""):
		return errors.New("--redis-mode, --redis-password-file, --redis-persecond-url and --redis-tls-* need --redis-url")
	case (s.redisTLSCA != "" || s.redisTLSCert != "") && (!strings.HasPrefix(s.redisURL, "rediss://") ||
		s.redisPerSecondURL != "" && !strings.HasPrefix(s.redisPerSecondURL, "rediss://")):
		return errors.New("--redis-tls-* need rediss:// Redis URLs")
	case s.redisURL == "" && s.journal == "on":
		return errors.New("--charge-journal needs --redis-url: the in-memory store has no replica to confirm a charge and loses everything with the process")
	case s.journalSizeSet && s.journal == "off":
		return errors.New("--charge-journal-size needs the charge journal (--charge-journal auto or on)")
	}
	return s.validateCarry()
}

// validateCarry refuses --carry-incumbent-counts where there are no
// incumbent counts to read in one script.
func (s *settings) validateCarry() error {
	switch {
	case s.svc.CarryIncumbent && s.redisURL == "":
		return errors.New("--carry-incumbent-counts needs --redis-url: the incumbent's counts are in its Redis")
	case s.svc.CarryIncumbent && s.redis.Mode == redisstore.ModeCluster:
		return errors.New("--carry-incumbent-counts needs a single or Sentinel Redis: on Cluster the incumbent's keys live in other slots than ratelimitd's")
	}
	return nil
}

func (s *settings) validateServe() error {
	if err := certPair("grpc", s.grpcTLSCert, s.grpcTLSKey); err != nil {
		return err
	}
	switch {
	case s.logFormat != "text" && s.logFormat != "json":
		return fmt.Errorf("--log-format must be text or json, got %q", s.logFormat)
	case s.grpcClientCA != "" && s.grpcTLSCert == "":
		return errors.New("--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key")
	case s.grpcMaxMessage < 1024:
		return fmt.Errorf("--grpc-max-message-size must be at least 1024, got %d", s.grpcMaxMessage)
	case s.drainDelay < 0:
		return fmt.Errorf("--drain-delay must not be negative, got %v", s.drainDelay)
	}
	return nil
}

func (s *settings) validateStats() error {
	switch {
	case !strings.HasPrefix(s.stats.compatPath, "/"):
		return fmt.Errorf("--compat-metrics-path %q must start with /", s.stats.compatPath)
	case s.stats.mapper != "" && s.stats.compatAddr == "":
		return errors.New("--compat-metrics-mapper needs --compat-metrics-addr")
	}
	return nil
}
