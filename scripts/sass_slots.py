"""Count SASS instructions per unrolled slot of a kernel's loop (how the e5m6 encode was measured).

    # 1. CUDA source of one configuration (no GPU needed), e.g. the shipped x bf16 e5m6 token_cast:
    python -c "from kernels import quant, _tilelang; c = quant.TokenConfig('x', 'bfloat16', 'e5m6');
    open('k.cu', 'w').write(_tilelang.lower_to_cuda(quant.TOKEN_CAST.build(c)))"
    # 2. cubin for sm_90 with line info (TL = tilelang's package folder), ptxas registers / spills:
    nvcc -std=c++20 -w -lineinfo -arch=sm_90 -cubin -I$TL/src -I$TL/3rdparty/cutlass/include \
         --ptxas-options=--verbose -o k.cubin k.cu
    # 3. SASS with source lines, then the counts (START, END: hex addresses bounding the loop; GUARD: the
    #    .cu line of the per-slot `if` whose branch opens each slot):
    nvdisasm -g -c k.cubin > k.gsass
    python scripts/sass_slots.py k.gsass START END GUARD [SLOT_TO_LIST]

Prints, per slot, the number of instructions and the opcode mix; with SLOT_TO_LIST the slot's listing
with each instruction's source file and line.
"""
import re, sys, collections
path, start, end, guard = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16), int(sys.argv[4])
cur = None; insts = []
for l in open(path):
    if '//##' in l:
        m = re.search(r'File "([^"]+)", line (\d+)', l)
        cur = (os_base := m.group(1).split('/')[-1], int(m.group(2))) if m else cur
        continue
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)', l)
    if m:
        a = int(m.group(1), 16)
        if start <= a < end:
            insts.append((a, cur, m.group(3), l.strip()))
# slots begin at a BRA whose line is the guard line and which is followed (within 4) by ... simply: the guard's "@P0 BRA"
slots = []; curslot = []
for ins in insts:
    a, (f, ln), op, text = ins
    if op == 'BRA' and ln == guard and f.endswith('.cu') and curslot:
        slots.append(curslot); curslot = []
    curslot.append(ins)
slots.append(curslot)
for i, s in enumerate(slots):
    ops = collections.Counter(op for _, _, op, _ in s)
    print(f"slot {i}: {len(s)} instructions", dict(ops.most_common()))
    if len(sys.argv) > 5 and i == int(sys.argv[5]):
        for a, (f, ln), op, text in s: print(f"  {f[-20:]}:{ln}  {text}")
