// Package schemapaths flattens an OpenAPI schema into the set of paths a
// document may use, so two CRDs can be compared for what they accept.
package schemapaths

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// Of lists "path type" for every node of s: properties as ".name", array
// items as "[]", map values as "{}". A node that preserves unknown fields is
// marked with a trailing "*": anything below it is kept.
func Of(s *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	walk(s, "", &out)
	return out
}

func walk(s *apiextensionsv1.JSONSchemaProps, path string, out *[]string) {
	typ := s.Type
	if s.XIntOrString {
		typ = "int-or-string"
	}
	if typ == "" {
		typ = "any"
	}
	p := path
	if p == "" {
		p = "."
	}
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
		p += "*"
	}
	*out = append(*out, p+" "+typ)
	for name, prop := range s.Properties {
		walk(&prop, path+"."+name, out)
	}
	if s.Items != nil && s.Items.Schema != nil {
		walk(s.Items.Schema, path+"[]", out)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		walk(s.AdditionalProperties.Schema, path+"{}", out)
	}
}
