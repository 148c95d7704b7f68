// Package pool is str's one policy for things made ahead of demand: the
// worker's warm pool (pooled sandboxes with a tool's module imported,
// worker/pool.go), str serve's pre-built sandboxes (an init awaiting
// its call, launcher/resident) and the worker's per-tool templates
// (shared items: worker/template.go, launcher/template) are each a Pool
// of this package. What an item is, how it is built, checked and handed
// its call stays with the caller; nothing here knows about sandboxes.
//
// The policy, in full:
//
//   - Sets. A pool holds sets by name (a tool, a served profile), each
//     with a Spec: a key (an item may serve only calls of the same key;
//     a set whose key or size changes is drained and replaced: Configure),
//     a size and a cost.
//   - Size. A set's size counts its items idle, being built and serving a
//     call (claimed, until the claimer's Done), so a claimed item is
//     replaced once its call is over, not at the claim: a build begun at
//     the claim runs beside the call on the same CPUs, which the call
//     waits for, and saves nothing. Calls beyond the size find none.
//   - Budget. Optional (Config.Budget > 0): each item counts its set's
//     cost from the start of its build until it is claimed or gone; a
//     build that does not fit waits. Sets fill in the order of names.
//   - Building. One item at a time, by one filler goroutine woken by
//     every change and once per Tick. Build returns once the item exists;
//     it becomes ready (Item.Ready) on its own, while the next one is
//     built. The time from the start of its build to its readiness is
//     reported (Metrics.Built).
//   - Claim. The oldest idle item of the set whose key is the call's:
//     one that ended is retired as its death (below), one older than
//     MaxAge "aged",
//     one the caller's own check refuses by the reason it gives (the
//     worker: "code_changed", or "died" when it cannot be armed); the
//     next is tried. With Config.ReadyOnly only ready items are taken
//     (others stay). A set with no item for the call counts a miss, a
//     name without a set nothing.
//   - Shared items. With Config.Uses > 0 an item serves many calls at
//     once (a template forks each call): a claim takes one use and the
//     item stays idle for the next claims; the claim that takes its
//     Uses-th use retires it "calls" (its set builds the replacement at
//     once). Size counts items, not uses. A shared item retired while
//     uses are in flight (aged, its set changed, the pool stopped, used
//     up) drains: it is killed once the last use is Done, so a call never
//     fails because its item was recycled.
//   - Age. An idle item older than MaxAge is retired "aged" and replaced
//     (each Tick, and at claim). An item may carry its own limits as a
//     backstop (Backstop beyond MaxAge); one that ends at them
//     (Item.EndReason: Aged, Calls) is retired under that reason.
//   - Death. An idle item that ends otherwise before the pool retires it
//     is retired under its EndReason ("died", or the caller's own: a
//     template's "failed_check", a start that failed after Build
//     returned); a build that fails counts a build failure. Either starts
//     its set's backoff: the next build of the set waits BackoffFirst,
//     doubling per failure up to BackoffMax (Config may set both), reset
//     once an item of the set is ready; SetState.Backoff says what
//     started it. So an item that crashes at start cannot make the pool
//     spin.
//   - Shutdown. Stop ends building and retires every idle item
//     "drained" (killed; a shared one once its uses are Done); claimed
//     items stay their claimers'. Wait then
//     cancels the pool's context (the one every Build got) and returns
//     once every item the pool built is gone and released.
//
// Every count goes through one Metrics: hits, misses, items built (ready),
// build failures, retirements by reason, and per set the idle and ready
// items and the budget held. The worker's /metrics names
// (str_worker_warm_*, and str_worker_templates_* and
// str_worker_template_start_failures_total for the templates) are fed
// from it.
package pool
