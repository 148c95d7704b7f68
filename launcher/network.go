package launcher

// startEgress serves the sandbox's egress listeners (wired to package
// egress in the next step; until then nothing is planned to listen).
func (s *Sandbox) startEgress() {
	for _, f := range s.listeners {
		f.Close()
	}
}
