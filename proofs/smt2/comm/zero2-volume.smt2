; placement-logic proof obligation: comm/zero2-volume
; theorem: Communication derivation
; ZeRO-2 volume = 1 × DP
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: volume(ZeRO-2) / volume(DP) = 1
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x0 (to_real N)))
 (<= 2.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (not (= 1.0 1.0)))
(check-sat)
(exit)
