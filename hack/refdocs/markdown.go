package main

import (
	"fmt"
	"strings"
)

// table renders a Markdown table. Cells come escaped: through text or code.
func table(b *strings.Builder, head []string, rows [][]string) {
	fmt.Fprintf(b, "| %s |\n", strings.Join(head, " | "))
	b.WriteString(strings.Repeat("| --- ", len(head)) + "|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %s |\n", strings.Join(r, " | "))
	}
	b.WriteString("\n")
}

// textEscaper keeps a prose cell on one line and stops Markdown from reading
// help texts' <placeholders> as HTML or their pipes as column breaks.
var textEscaper = strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;", "\r", "", "\n", " ")

// text is s as a prose table cell.
func text(s string) string { return textEscaper.Replace(strings.TrimSpace(s)) }

// code is s as an inline-code table cell; empty stays empty. Entities are
// not decoded in code spans, so only the pipe is escaped (GFM tables unescape
// it there).
func code(s string) string {
	if s == "" {
		return ""
	}
	s = strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}
