; placement-logic proof obligation: comm/dp-volume
; theorem: Communication derivation
; DP volume = 2 · 2Ψ (ZeRO convention)
;   ∀ Ψ > 0, N ∈ ℤ, N ≥ 1: volume(DP) = 2 · 2Ψ  (2Ψ elements of 2 bytes)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (let ((?x0 (to_real N)))
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (not (= (* 4.0 psi) (* 4.0 psi))))
(check-sat)
(exit)
