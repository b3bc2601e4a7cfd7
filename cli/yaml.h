/* A JSON value written as block-style YAML, for manifests that people
 * read and edit (`trainctl manifest`).
 *
 * Objects become mappings in their key order, arrays block sequences,
 * strings with a line break literal block scalars (`|`, `|-` without a
 * final one), other strings plain where YAML 1.1 and 1.2 both read them
 * back as the same string (never as a number, bool or null), else
 * double-quoted with JSON's escapes, which YAML's double-quoted style
 * shares.  So a YAML parser returns exactly the JSON value.
 */
#ifndef TR_CLI_YAML_H
#define TR_CLI_YAML_H

#include <jansson.h>
#include <stdio.h>

/* Writes doc (an object) as one YAML document, without the `---`
 * separator.  0, or -1 when writing failed. */
int tr_yaml_write(FILE *out, const json_t *doc);

#endif
