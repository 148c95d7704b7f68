package worker

// requester is who a request is from, as far as the worker could verify
// it: the key that rate limits, fair shares, quotas, cancels and the audit
// log are bound to. Without request signing or user tokens nothing is
// verified and the claimed params.user_id is all there is (the
// reference's model: anyone who can publish on the invoke topics can act
// as any user); Verified says which case a requester is.
type requester struct {
	UserID   string // params.user_id, equal to the verified claim when Verified
	Verified bool   // a signature or token bound UserID to this request
	Via      string // what verified it ("" when unverified): "shared-secret", "key:ID", "token", joined by "+"
	// Key is the id of the agent key of STR_SIGNING_KEYS that verified
	// the request ("" for none). Besides the user's share, the calls of
	// all the users one key claims share the key's (sched.go): a key may
	// claim many users, and made-up users must not multiply its share.
	Key string
}

// key is the string per-requester state is kept under. Verified and
// unverified requesters never share a key, so an unsigned request claiming
// a user cannot spend or read that user's verified budget.
func (r requester) key() string {
	if r.Verified {
		return "verified:" + r.UserID
	}
	return "unverified:" + r.UserID
}
