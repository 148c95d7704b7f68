package worker

import (
	"sync"
	"time"
)

// rateLimiter is a per-user token bucket; nil when off.
type rateLimiter struct {
	mu      sync.Mutex
	rate    float64 // tokens per second
	burst   float64
	buckets map[string]*bucket
	sweep   time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(perMinute float64, burst int) *rateLimiter {
	if perMinute <= 0 {
		return nil
	}
	b := float64(burst)
	if b <= 0 {
		b = perMinute
	}
	return &rateLimiter{rate: perMinute / 60, burst: b, buckets: map[string]*bucket{}}
}

func (r *rateLimiter) allow(user string, now time.Time) bool {
	if r == nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Forget full buckets now and then so idle users cost nothing.
	if now.Sub(r.sweep) > time.Minute {
		for u, b := range r.buckets {
			if b.tokens+now.Sub(b.last).Seconds()*r.rate >= r.burst {
				delete(r.buckets, u)
			}
		}
		r.sweep = now
	}
	b := r.buckets[user]
	if b == nil {
		b = &bucket{tokens: r.burst, last: now}
		r.buckets[user] = b
	}
	b.tokens += now.Sub(b.last).Seconds() * r.rate
	if b.tokens > r.burst {
		b.tokens = r.burst
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
