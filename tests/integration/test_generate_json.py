#!/usr/bin/env python3
"""semflow generate --json / --json-schema / --regex / --grammar from the outside, on the demo model (random
weights): a schema with one boolean leaves the model no way but to write {"ok": true|false} and
end, so the output parses to that; --json ends (or is cut) as one object; a bounded pattern ends
as a whole match of it; a pattern no token can continue is an error that says so; a bad schema or
pattern is exit 2 with why."""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import BIN, check, results  # noqa: E402


def generate(*args):
    p = subprocess.run([BIN, "generate", "--model", "demo", "--prompt", "A record:", *args], capture_output=True,
                       timeout=300)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def main():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    rc, out, err = generate("--json-schema", json.dumps(schema), "--max-tokens", "400", "--seed", "1")
    try:
        v = json.loads(out)
    except ValueError:
        v = None
    check("generate_json_schema_instance", rc == 0 and isinstance(v, dict) and list(v) == ["ok"] and
          isinstance(v["ok"], bool) and "finish: stop" in err, (rc, out[-300:], err[-300:]))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(schema, f)
    rc2, out2, _ = generate("--json-schema", f.name, "--max-tokens", "400", "--seed", "1")
    os.unlink(f.name)
    check("generate_json_schema_from_file", rc2 == 0 and out2 == out, (rc2, out2[-200:]))
    rc, out, err = generate("--json", "--max-tokens", "60", "--seed", "2")
    check("generate_json_starts_object", rc == 0 and out.lstrip().startswith("{"), (rc, out[:200], err[-200:]))
    for bad, says in (('{"type": "array"}', "root"), ('{"type": "object", "properties": {"a": {"format": "x"}}}',
                                                     "'format'"), ("/nonexistent/schema.json", "No such file")):
        rc, out, err = generate("--json-schema", bad)
        check("generate_json_schema_refused_" + says.strip("'").split()[0].lower(), rc == 2 and says in err, (rc, err))
    for i, pat in enumerate((r"\d{3}-\d{4}", r"(red|green|blue) [a-z]{2,5}!", r"[A-Z][a-z]{1,7}( [a-z]{1,7}){1,3}\.")):
        rc, out, err = generate("--regex", pat, "--max-tokens", "80", "--seed", str(i), "--temperature", "1")
        check("generate_regex_match_%d" % i, rc == 0 and re.fullmatch(pat, out.rstrip("\n")) is not None and
              "finish: stop" in err, (pat, rc, out[-200:], err[-200:]))
    rc, out, err = generate("--regex", "\\u00ff\\u00fe", "--max-tokens", "5")
    check("generate_regex_no_token_fits", rc == 1 and "no token of the model's vocabulary" in err, (rc, err[-300:]))
    for bad, says in (("(a", "without its ')'"), ("a(?<=b)", "lookaround"), ("a{5,2}", "minimum")):
        rc, out, err = generate("--regex", bad)
        check("generate_regex_refused_" + says.strip("'").split()[0].lower(), rc == 2 and says in err, (rc, err))
    rc, out, err = generate("--regex", "a", "--json")
    check("generate_regex_and_json_refused", rc == 2 and "not both" in err, (rc, err))
    g = 'root ::= ("yes" | "no") ", " word (" " word){0,3} "."\nword ::= [a-z]{2,6}\n'
    rc, out, err = generate("--grammar", g, "--max-tokens", "80", "--seed", "5", "--temperature", "1")
    check("generate_grammar_in_language", rc == 0 and "finish: stop" in err and
          re.fullmatch(r"(yes|no), [a-z]{2,6}( [a-z]{2,6}){0,3}\.", out.rstrip("\n")) is not None, (rc, out, err[-200:]))
    with tempfile.NamedTemporaryFile("w", suffix=".gbnf", delete=False) as f:
        f.write(g)
    rc2, out2, _ = generate("--grammar-file", f.name, "--max-tokens", "80", "--seed", "5", "--temperature", "1")
    os.unlink(f.name)
    check("generate_grammar_file_same", rc2 == 0 and out2 == out, (rc2, out2))
    for bad, says in (("root ::= a\na ::= \"x\" a?", "refers back to itself"), ("root ::= \"a", "line 1, column 10")):
        rc, out, err = generate("--grammar", bad)
        check("generate_grammar_refused_" + says.split()[0], rc == 2 and says in err, (rc, err))
    rc, out, err = generate("--grammar-file", "/nonexistent.gbnf")
    check("generate_grammar_file_missing", rc == 2 and "No such file" in err, (rc, err))
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
