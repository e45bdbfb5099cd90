#!/usr/bin/env python3
"""Host model of kda_bwd_intra_kernel (kernels/cuda/kda_chunk_bwd_kernel.cuh): its loops and index
maps (units per part, F5 pivots, masks for partial chunks) transcribed in float64 and compared
with the CPU twin's per-pair loops (kernels/cpu/kda_chunk_bwd.cpp [E4]); checks that every
(row < L, channel) output is written by exactly one thread and every evaluated exponent is <= 0;
then the lane map of row_sums16. Slow (pure Python loops, about a minute). Run by hand when the kernel's index maps change.
"""
import numpy as np, math
kC=64
def twin(q,k,g,Aq,Ak,beta,L,K):
    dq2=np.zeros((L,K)); dk2n=np.zeros((L,K)); dkt=np.zeros((L,K))
    for r in range(L):
        for s in range(r+1):
            aq=Aq[r,s]; ak=Ak[r,s] if s<r else 0.0
            e=np.exp2(g[r]-g[s]); kse=k[s]*e
            dq2[r]+=aq*kse; dk2n[r]+=ak*kse; dkt[s]+=(aq*q[r]+ak*beta[r]*k[r])*e
    return dq2,dk2n,dkt
def gpu(q,k,g,Aq,Ak,beta,L,K,Kt):
    # staged: rows >= L zero
    Q=np.zeros((kC,K)); Kk=np.zeros((kC,K)); G=np.zeros((kC,K)); AQ=np.zeros((kC,kC)); AK=np.zeros((kC,kC)); B=np.zeros(kC)
    Q[:L]=q; Kk[:L]=k; G[:L]=g; AQ[:L]=Aq[:L]; AK[:L]=Ak[:L]; B[:L]=beta
    out={}; cover=np.zeros((kC,K),int); nexp=[0]
    def ex(x):
        assert x<=1e-12, x   # every evaluated exponent <= 0
        nexp[0]+=1; return 2.0**x
    kUnits=4*K//256
    for tid in range(256):
        part=tid//K; c=tid%K
        for n in range(kUnits):
            b=16*(part if n==0 else 3-part)
            if b>=L: continue
            dq=[0.0]*16; dk=[0.0]*16; dkt=[0.0]*16
            gp=G[b,c]
            for s0 in range(0,b,16):
                kg=[Kk[s0+u,c]*ex(gp-G[s0+u,c]) for u in range(16)]
                for i in range(16):
                    if b+i>=L: break
                    for u in range(16):
                        dq[i]+=AQ[b+i,s0+u]*kg[u]; dk[i]+=AK[b+i,s0+u]*kg[u]
            for i in range(16):
                a=ex(G[b+i,c]-gp) if b+i<L else 0.0
                dq[i]*=a; dk[i]*=a
            gs=[G[b+u,c] for u in range(16)]; ks=[Kk[b+u,c] for u in range(16)]
            for i in range(16):
                r=b+i
                if r>=L: break
                qr=Q[r,c]; kb=B[r]*ks[i]
                for u0 in range(0,i+1,4):
                    x=AQ[r,b+u0:b+u0+4]; y=AK[r,b+u0:b+u0+4]
                    for t in range(4):
                        if not u0+t<i: break
                        u=u0+t; e=ex(gs[i]-gs[u]); kse=ks[u]*e
                        dq[i]+=x[t]*kse; dk[i]+=y[t]*kse; dkt[u]+=(x[t]*qr+y[t]*kb)*e
                    if i-u0<4:
                        dq[i]+=x[i-u0]*ks[i]; dkt[i]+=x[i-u0]*qr
            p=b+16
            while p<L:
                gp=G[p,c]; t=[0.0]*16
                for r in range(p,min(p+16,L)):
                    a=ex(G[r,c]-gp); qa=Q[r,c]*a; ka=(B[r]*Kk[r,c])*a
                    for u in range(16): t[u]+=AQ[r,b+u]*qa+AK[r,b+u]*ka
                for u in range(16): dkt[u]+=ex(gp-G[b+u,c])*t[u]
                p+=16
            for i in range(16):
                r=b+i
                if r>=L: continue
                cover[r,c]+=1; out[(r,c)]=(dq[i],dk[i],dkt[i])
    assert (cover[:L]==1).all() and (cover[L:]==0).all()
    dq2=np.zeros((L,K)); dk2n=np.zeros((L,K)); dkt=np.zeros((L,K))
    for (r,c),(a,b_,d) in out.items(): dq2[r,c]=a; dk2n[r,c]=b_; dkt[r,c]=d
    return dq2,dk2n,dkt,nexp[0]
rng=np.random.default_rng(1)
for K in (64,128):
  for L in (64,63,49,48,47,33,32,17,16,15,1):
    a=-rng.uniform(0.0,0.3,(L,K)); g=np.cumsum(a,0)/math.log(2)
    # strongly decaying channel: exponents far below -126 in some pairs
    g[:,0]=np.cumsum(-rng.uniform(0,20,L))
    q=rng.standard_normal((L,K)); k=rng.standard_normal((L,K)); beta=rng.uniform(0,1,L)
    Aq=np.tril(rng.standard_normal((L,L))); Ak=np.tril(rng.standard_normal((L,L)),-1)
    A=np.zeros((kC,kC)); A[:L,:L]=Aq; Aq=A; A=np.zeros((kC,kC)); A[:L,:L]=Ak; Ak=A
    t=twin(q,k,g,Aq,Ak,beta,L,K); gg=gpu(q,k,g,Aq,Ak,beta,L,K,K)
    err=max(np.abs(x-y).max()/max(1e-300,np.abs(x).max()) for x,y in zip(t,gg[:3]))
    print(K,L,'rel max err %.2e'%err,'exps',gg[3])
    assert err<1e-12
print('ok')

# row_sums16: lane l gets the sum over the 32 lanes of value (l >> 1) & 15.
import random
V=[[random.random() for _ in range(16)] for _ in range(32)]
v=[row[:] for row in V]
for H in (8,4,2,1):
    new=[row[:] for row in v]
    for l in range(32):
        up=bool(l&(2*H)); p=l^(2*H); pup=bool(p&(2*H))
        for x in range(H):
            keep=v[l][x+H] if up else v[l][x]
            recv=v[p][x] if pup else v[p][x+H]   # partner's send
            new[l][x]=keep+recv
    v=new
res=[v[l][0]+v[l^1][0] for l in range(32)]
for l in range(32):
    row=(l>>1)&15
    assert abs(res[l]-sum(V[m][row] for m in range(32)))<1e-9
print("row_sums16 ok")
