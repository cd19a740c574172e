// a template touching the sandbox's library wrappers
@ local t = {}
@ for i = 1, 8 do table.insert(t, 1, ("v%d"):format(i)) end
@ table.remove(t, 2)
@ table.sort(t, function(a, b) return a > b end)
@ local s = table.concat(t, ", ")
const char *names = "${s}";  // ${#t} names, 'v3' at ${s:find("v3") or "nil"}
@ local rows = {}
@ for i, v in ipairs(t) do rows[#rows + 1] = ("  x[%d] = %s;"):format(i - 1, ("%q"):format(v)) end
${table.concat(rows, "\n")}
@@ not a statement: $${literal}
@ local moved = table.move({1, 2, 3}, 1, 3, 2)
int pad = ${("-"):rep(4, "+")}${utf8.char(72, 105)} ${math.max(3, 7)} ${string.byte("A")};
