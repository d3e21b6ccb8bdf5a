// Package aftergc runs a function after every garbage collection, from
// a finalizer the collector calls: nothing runs between collections, so
// an idle process pays nothing for it (internal/gctune and
// internal/memgov measure the heap so).
package aftergc

import "runtime"

// sentinel is the object whose finalizer runs once per collection.
type sentinel struct{ fn func() bool }

// Run calls fn after each collection from the next one on, until fn
// returns false. fn runs on the runtime's finalizer goroutine: it must
// not block for long.
func Run(fn func() bool) {
	s := &sentinel{fn: fn}
	runtime.SetFinalizer(s, func(s *sentinel) {
		if s.fn() {
			Run(s.fn)
		}
	})
}
