; placement-logic proof obligation: comm/zero3-volume
; theorem: Communication derivation
; ZeRO-3 volume = 1.5 × DP
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: volume(ZeRO-3) / volume(DP) = 1.5
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
 (not (= (/ 3.0 2.0) (/ 3.0 2.0))))
(check-sat)
(exit)
