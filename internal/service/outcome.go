package service

// The decision vocabulary, defined once: each descriptor's decision has
// one outcome, the value of the outcome label of
// ratelimitd_decisions_total and the reason given in the response's
// dynamic_metadata (--decision-metadata), which also gives the two
// reasons for a descriptor that is not decided at all.
const (
	// OutcomeOK: under the limit.
	OutcomeOK = "ok"
	// OutcomeNearLimit: under the limit, past NearLimitRatio of it.
	OutcomeNearLimit = "near_limit"
	// OutcomeOverLimit: over the limit, decided by the store.
	OutcomeOverLimit = "over_limit"
	// OutcomeLocalCache: over the limit, known from the local over-limit
	// cache without asking the store.
	OutcomeLocalCache = "local_cache"
	// OutcomeShadow: over the limit of a rule in shadow mode, let through.
	OutcomeShadow = "shadow"
	// OutcomeFailOpen: the store could not decide; answered OK by the
	// rule's (or the global) failure_mode allow.
	OutcomeFailOpen = "fail_open"
	// OutcomeFailClosed: the store could not decide; answered OVER_LIMIT
	// by failure_mode deny.
	OutcomeFailClosed = "fail_closed"
	// OutcomeUnlimited: the rule says unlimited: true.
	OutcomeUnlimited = "unlimited"

	// ReasonNoRule: no rule matched, or the rule has no rate_limit
	// (dynamic_metadata only: nothing was decided, nothing is counted).
	ReasonNoRule = "no_rule"
	// ReasonReplaced: the rule's limit was replaced by another's
	// (dynamic_metadata only).
	ReasonReplaced = "replaced"
)

// The result label of ratelimitd_hits_total: what became of a counted
// descriptor's hits.
const (
	// HitsCharged: recorded on the counter.
	HitsCharged = "charged"
	// HitsRefused: not recorded, because the call was refused (all or
	// nothing: rejected_hits nothing, or hits the call did not state).
	HitsRefused = "refused"
	// HitsLost: not recorded, because the store could not decide; the
	// failure policy answered the call.
	HitsLost = "lost"
	// HitsUnknown: maybe recorded: the store call timed out, or the
	// caller went away, after it may have reached Redis (the failure
	// policy answered, or no one).
	HitsUnknown = "unknown"
	// HitsKept: a usage charge the store could not take (or whose
	// outcome is unknown), kept by its charge journal to apply when it
	// answers (--charge-journal); ratelimitd_charge_journal_total says
	// what became of it.
	HitsKept = "kept"
)
