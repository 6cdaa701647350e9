#!/usr/bin/env python3
"""CUDA C source -> C++ for the CPU emulation of a device (common/cuda/emu).

    translate.py IN.cu OUT.cc

Two rewrites, nothing else (the rest is spb_emu.h's macros), in the .cu and in
every .cuh next to it that it includes and that holds either (a kernel file
split for length: cuda_attention_*.cuh), which is inlined between #line
markers:
  kernel<<<grid, block[, shared[, stream]]>>>(args);
      -> spb_emu_launch(kernel, "kernel", spb_emu_config(grid, block[, shared[, stream]]), args);
  extern __shared__ [__align__(N)] TYPE name[];
      -> TYPE *name = (TYPE *)spb_emu_dynamic_shared();
The output starts with a #line so that compiler errors name the .cu file.
"""
import os
import re
import sys

SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s]*?)\s+(\w+)\s*\[\s*\]\s*;")


def kernel_start(text, end):
    """Index where the kernel expression ending at `end` (just before <<<)
    begins: an identifier, optionally qualified and with template
    arguments (balanced <...>)."""
    i = end
    while True:
        while i > 0 and text[i - 1].isspace():
            i -= 1
        if i > 0 and text[i - 1] == ">":  # template arguments
            depth = 0
            while i > 0:
                i -= 1
                if text[i] == ">":
                    depth += 1
                elif text[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
            while i > 0 and text[i - 1].isspace():
                i -= 1
        j = i
        while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
            j -= 1
        if j == i:
            raise SystemExit("translate.py: no kernel name before <<< at offset %d" % end)
        i = j
        if text[i - 2:i] == "::":
            i -= 2
            continue
        return i


def matching_paren(text, open_idx):
    depth = 0
    for i in range(open_idx, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SystemExit("translate.py: unbalanced ( at offset %d" % open_idx)


def translate(text):
    text = SHARED.sub(lambda m: "%s *%s = (%s *)spb_emu_dynamic_shared();" % (m.group(1), m.group(2), m.group(1)),
                      text)
    out, pos = [], 0
    while True:
        a = text.find("<<<", pos)
        if a < 0:
            break
        b = text.find(">>>", a)
        if b < 0:
            raise SystemExit("translate.py: <<< without >>> at offset %d" % a)
        k = kernel_start(text, a)
        p = b + 3
        while text[p].isspace():
            p += 1
        if text[p] != "(":
            raise SystemExit("translate.py: no argument list after >>> at offset %d" % b)
        q = matching_paren(text, p)
        args = text[p + 1:q].strip()
        kernel = text[k:a].strip()
        # keep the line count: newlines inside the launch stay where they were
        name = " ".join(kernel.split()).replace("\\", "").replace('"', "")
        call = 'spb_emu_launch(%s, "%s", spb_emu_config(%s)%s)' % (kernel, name, text[a + 3:b],
                                                                (", " + args) if args else "")
        out.append(text[pos:k])
        out.append(call + "\n" * (text[k:q + 1].count("\n") - call.count("\n")))
        pos = q + 1
    out.append(text[pos:])
    return "".join(out)


INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"/]+\.cuh)"[ \t]*$', re.M)


def inline_kernel_parts(path, text):
    """The .cu's text with each included .cuh of its directory that holds
    kernels' dynamic shared memory or launches (what translate() rewrites)
    put in place of its #include, between #line markers, so that its
    kernels are rewritten too and errors still name the .cuh and its line.
    Other headers (the PTX wrappers) stay includes."""
    def inline(m):
        part = os.path.join(os.path.dirname(path), m.group(1))
        if not os.path.exists(part):
            return m.group(0)
        with open(part) as f:
            body = f.read()
        if not (SHARED.search(body) or "<<<" in body):
            return m.group(0)
        next_line = text.count("\n", 0, m.start()) + 2  # the line after the #include
        return '#line 1 "%s"\n%s\n#line %d "%s"' % (part, inline_kernel_parts(part, body), next_line, path)
    return INCLUDE.sub(inline, text)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: translate.py IN.cu OUT.cc")
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    result = '#line 1 "%s"\n' % src + translate(inline_kernel_parts(src, text))
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with open(dst, "w") as f:
        f.write(result)


if __name__ == "__main__":
    main()
